#!/usr/bin/env bash
# Crash consistency and full disk, the long form of the ctest label `reliability`
# (docs/RELIABILITY.md): KILLS (default 60) SIGKILLs of dapod at seeded random moments during
# uploads, job creation, training and checkpoint writes, every invariant checked after each
# restart and the final weights compared with an uninterrupted run (tests/reliability/crash.py);
# then the full-disk check on a small tmpfs (tests/reliability/full_disk.py; mounting needs root).
# Builds dapod in BUILD_DIR (default build) first (not with CRASHTEST_SKIP_BUILD=1).
# Usage: scripts/crashtest.sh [KILLS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-60}
seed=${2:-1}
build=${BUILD_DIR:-build}
[ -n "${CRASHTEST_SKIP_BUILD:-}" ] || bash scripts/setup.sh "$build" >/dev/null
dapod="$build/server/dapod"
echo "== crash consistency: $kills kills, seed $seed (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
/usr/bin/python3 tests/reliability/crash.py --dapod "$dapod" --kills "$kills" --seed "$seed" \
  --jobs $(( kills / 4 > 2 ? kills / 4 : 2 )) --steps 24 --max-delay 3
echo "== full disk"
rc=0
/usr/bin/python3 tests/reliability/full_disk.py --dapod "$dapod" || rc=$?
if [ "$rc" -eq 77 ]; then echo "full disk: skipped (mount not permitted; run as root)"; rc=0; fi
exit $rc
