#!/bin/sh
# Installs the pinned npm packages of clients/web/package-lock.json (uPlot) into WORKDIR (under
# the build dir; nothing downloaded is committed) and copies uPlot's dist files into OUTDIR, the
# folder dapod serves. Never fails the build: without npm, or when `npm ci` fails (no network),
# it says so, removes stale copies, and the page shows that the charts are unavailable.
# Writes OUTDIR/.assets-stamp either way; delete it (or change the lock file) to try again.
# Usage: fetch_assets.sh WORKDIR OUTDIR
set -u
work=$1
out=$2
src=$(cd "$(dirname "$0")" && pwd)
files="uPlot.esm.js uPlot.min.css"
mkdir -p "$work" "$out"

fail() {
  echo "fetch_assets.sh: $1; the dashboard's charts are unavailable in this build" >&2
  for f in $files; do rm -f "$out/$f"; done
  echo "failed: $1" >"$out/.assets-stamp"
  exit 0
}

command -v npm >/dev/null 2>&1 || fail "npm not found"
for f in package.json package-lock.json; do
  cmp -s "$src/$f" "$work/$f" || cp "$src/$f" "$work/$f"
done
want=$(cksum <"$src/package-lock.json")
have=$(cat "$work/.installed" 2>/dev/null || true)
if [ "$want" != "$have" ] || [ ! -d "$work/node_modules/uplot/dist" ]; then
  rm -f "$work/.installed"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error --fetch-retries=1 \
    --fetch-timeout=30000 >&2) || fail "npm ci in $work failed"
  echo "$want" >"$work/.installed"
fi
for f in $files; do
  cp "$work/node_modules/uplot/dist/$f" "$out/$f" || fail "uplot/dist/$f is missing"
done
cp "$work/node_modules/uplot/LICENSE" "$out/uPlot.LICENSE.txt" 2>/dev/null || true
echo "ok: uplot $(cd "$work" && node -p 'require("./node_modules/uplot/package.json").version' 2>/dev/null)" \
  >"$out/.assets-stamp"
