#!/bin/sh
# Installs the pinned npm packages of tests/web/package-lock.json (playwright-core) into WORKDIR
# with tests/npm_ci.sh and copies the browser test beside them.
# Exit 77 (skipped) when node, npm or /usr/bin/chromium is missing; 1 when the install fails.
# Usage: install.sh WORKDIR
set -eu
src=$(cd "$(dirname "$0")" && pwd)
if [ ! -x /usr/bin/chromium ]; then
  echo "install.sh: /usr/bin/chromium not found; skipping the browser test (scripts/setup.sh installs it)" >&2
  exit 77
fi
exec sh "$src/../npm_ci.sh" "$src" "$1" dashboard.test.mjs
