#!/usr/bin/env bash
# Load test (docs/RELIABILITY.md, "Load"): one daemon on loopback, the same job run four times
# (baseline, under load, baseline again, SSE subscribers only); under load SSE_CLIENTS (default
# 500) asyncio subscribers follow the job's event stream and wrk hits GET /healthz, /v1/jobs,
# /v1/jobs/{id}, /v1/jobs/{id}/metrics and /metrics for WRK_SECONDS (default 8) each. Prints
# throughput, p50/p99 latency, SSE delivery and the training step time with and without load
# (tests/reliability/load.py). Takes about two to four minutes. Builds dapod in BUILD_DIR (default
# build) first. Usage: [COMPUTE_CPUS=0] scripts/loadtest.sh [SSE_CLIENTS] [WRK_SECONDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
sse=${1:-500}
secs=${2:-8}
steps=${3:-80}
build=${BUILD_DIR:-build}
[ -n "${LOADTEST_SKIP_BUILD:-}" ] || bash scripts/setup.sh "$build" >/dev/null
command -v wrk >/dev/null || { echo "loadtest.sh: wrk is missing (scripts/setup.sh installs it)" >&2; exit 1; }
ulimit -n 4096 2>/dev/null || true
echo "== load test: $sse SSE subscribers, wrk ${secs}s per endpoint, jobs of $steps steps"
echo "   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
# COMPUTE_CPUS=0: the daemon trains on CPU 0 (compute_cpus) and everything else, the load
# generators included (taskset), runs on the other CPUs.
pin=()
if [ -n "${COMPUTE_CPUS:-}" ]; then
  others=$(/usr/bin/python3 -c 'import os, sys
want = set()
for part in sys.argv[1].split(","):
    lo, _, hi = part.partition("-")
    want.update(range(int(lo), int(hi or lo) + 1))
print(",".join(str(c) for c in sorted(os.sched_getaffinity(0)) if c not in want))' "$COMPUTE_CPUS")
  echo "   compute_cpus $COMPUTE_CPUS; load generators on CPUs $others"
  pin=(taskset -c "$others")
fi
exec "${pin[@]}" /usr/bin/python3 tests/reliability/load.py --dapod "$build/server/dapod" \
  --sse "$sse" --wrk-seconds "$secs" --steps "$steps" --compute-cpus "${COMPUTE_CPUS:-}"
