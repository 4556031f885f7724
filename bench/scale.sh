#!/usr/bin/env bash
# One DAPO step at Qwen2.5-0.5B's shape, ours (dapod train) against PyTorch, full fine-tune and
# LoRA, beside the machine's SGEMM peak and memory bandwidth (bench/README.md, "Realistic
# scale"). Builds dapod and bench_engine if needed; model folders, data and results live under
# the cache dir (default ~/.cache/dapod-bench), never in the repository. Reports, never fails on a
# time. Arguments go to bench/scale.py (--models 0.5b,1.5b, --parts, --threads, --coretype,
# --min-avail-gb, --wait-absent, --report-only; see its header). Needs /usr/bin/python3 with
# numpy (and torch for the PyTorch parts), node and npm (the tokenizer), ~20 GB of free memory.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
if [ ! -f "$build/CMakeCache.txt" ]; then cmake -S . -B "$build" >/dev/null; fi
cmake --build "$build" -j"$(nproc)" --target dapod bench_engine >/dev/null
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}"
exec /usr/bin/python3 bench/scale.py --build "$build" "$@"
