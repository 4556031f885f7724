#!/bin/sh
# Installs the pinned npm packages of tests/web/package-lock.json (playwright-core) into WORKDIR
# (a folder under the build dir; nothing downloaded is committed) and copies the browser test
# beside them. Reinstalls only when the lock file changed; a lock file serialises parallel runs.
# Exit 77 (skipped) when node, npm or /usr/bin/chromium is missing; 1 when the install fails.
# Usage: install.sh WORKDIR
set -eu
work=$1
src=$(cd "$(dirname "$0")" && pwd)

for tool in node npm /usr/bin/chromium; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install.sh: $tool not found; skipping the browser test (scripts/setup.sh installs it)" >&2
    exit 77
  fi
done

mkdir -p "$work"
exec 9>"$work/.install.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

for f in package.json package-lock.json dashboard.test.mjs; do
  cmp -s "$src/$f" "$work/$f" || cp "$src/$f" "$work/$f"
done
want=$(cksum <"$src/package-lock.json")
have=$(cat "$work/.installed" 2>/dev/null || true)
if [ "$want" != "$have" ] || [ ! -d "$work/node_modules/playwright-core" ]; then
  rm -f "$work/.installed"
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2); then
    echo "install.sh: npm ci in $work failed" >&2
    exit 1
  fi
  echo "$want" >"$work/.installed"
fi
