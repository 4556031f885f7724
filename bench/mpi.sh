#!/usr/bin/env bash
# Data-parallel steps on this machine, N = 1 against N = 2 (bench/mpi.py; docs/SCALE.md). Builds
# dapod if needed. Reports, never fails on a time. Arguments go to bench/mpi.py.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
if [ ! -f "$build/CMakeCache.txt" ]; then cmake -S . -B "$build" >/dev/null; fi
cmake --build "$build" -j"$(nproc)" --target dapod >/dev/null
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
exec /usr/bin/python3 bench/mpi.py --build "$build" "$@"
