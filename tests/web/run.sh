#!/bin/sh
# ctest entry of the browser test (label web): installs playwright-core under WORKDIR, then runs
# dashboard.test.mjs against DAPOD with Debian's chromium. Screenshots go to WORKDIR/artifacts.
# Usage: run.sh DAPOD WORKDIR
set -eu
dapod=$1
work=$2
src=$(cd "$(dirname "$0")" && pwd)
rc=0
sh "$src/install.sh" "$work" || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
exec node "$work/dashboard.test.mjs" --dapod "$dapod" --data "$src/../data/addition.jsonl" \
  --invalid "$src/../data/invalid.jsonl" --web "$src/../../clients/web" --artifacts "$work/artifacts" \
  --env-server "$src/../rl/env_server.py"
