#!/bin/sh
# The one way the tests install their pinned npm packages: copies SRC_DIR's package.json,
# package-lock.json and the named FILEs into WORKDIR (a folder under the build dir; nothing
# downloaded is committed) and runs `npm ci` there when the lock file changed since the last
# install. Several tests may call it at once (ctest -j): a lock file serialises them.
# Exit 77 (skipped) when node or npm is missing; 1 when the install fails.
# Usage: npm_ci.sh SRC_DIR WORKDIR [FILE...]
set -eu
src=$1
work=$2
shift 2

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "npm_ci.sh: $tool not found; skipping (scripts/setup.sh installs it)" >&2
    exit 77
  fi
done

mkdir -p "$work"
exec 9>"$work/.install.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

for f in package.json package-lock.json "$@"; do
  # only when changed: another test may be running the copy in $work right now
  cmp -s "$src/$f" "$work/$f" || cp "$src/$f" "$work/$f"
done
want=$(cksum <"$src/package-lock.json")
have=$(cat "$work/.installed" 2>/dev/null || true)
if [ "$want" != "$have" ] || [ ! -d "$work/node_modules" ]; then
  rm -f "$work/.installed"
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2); then
    echo "npm_ci.sh: npm ci in $work failed" >&2
    exit 1
  fi
  echo "$want" >"$work/.installed"
fi
