#!/usr/bin/env bash
# Ours vs PyTorch on this machine, in one run (bench/README.md): builds bench_engine if needed,
# measures the SGEMM peak, probes PyTorch's thread settings, then per model (tiny, small, medium)
# our engine and PyTorch measured alternately, and prints one comparison table. Reports, never fails on a
# time. JSON lines of every measurement land in bench/out/. About 5-7 minutes on 2 cores.
# Usage: bench/run.sh [MODEL...]     (default: tiny small medium)
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as the environment sets them; where the
# environment sets no kernel, every part (ours and PyTorch) runs the kernel dapod chose by
# measuring here (`dapod kernels`, docs/ENGINE.md), so both sides use the one dapod would use.
# The OpenBLAS kernel that ran is printed. OPENBLAS_NUM_THREADS (default: all cores) sets our
# thread count.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/out
mkdir -p "$out"
rm -f "$out"/*.json

if [ ! -f build/CMakeCache.txt ]; then cmake -S . -B build >/dev/null; fi
cmake --build build -j"$(nproc)" --target bench_engine bench_methods dapod >/dev/null
engine=build/bench/bench_engine
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  echo "== OpenBLAS kernel: the environment names none; dapod measures (dapod kernels)"
  build/server/dapod kernels | sed 's/^/   /'
  chosen=$(build/server/dapod kernels --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["kernel"])')
  if [ -n "$chosen" ]; then export OPENBLAS_CORETYPE="$chosen"; fi
fi

models=("$@")
[ ${#models[@]} -gt 0 ] || models=(tiny small medium)
have_torch=0
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then have_torch=1; fi

# steps / repetitions per model: enough for medians, within the time budget
args_for() {
  case "$1" in
  tiny) echo "--train-steps 9 --gen-reps 5" ;;
  small) echo "--train-steps 4 --gen-reps 3" ;;
  *) echo "--train-steps 2 --gen-reps 2" ;;
  esac
}

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}" \
  "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg) (the machine may be shared)"
echo "== SGEMM peak"
"$engine" --sgemm >"$out/sgemm-start.json"
if [ $have_torch = 1 ]; then
  echo "== PyTorch thread settings"
  /usr/bin/python3 bench/bench_torch.py --probe >"$out/probe.json"
else
  echo "== /usr/bin/python3 cannot import torch: our figures only"
fi
for m in "${models[@]}"; do
  echo "== $m"
  if [ $have_torch = 1 ]; then
    # ours (bench_engine --serve) and PyTorch measured alternately, in one process pair
    # shellcheck disable=SC2046
    /usr/bin/python3 bench/bench_torch.py --model "$m" --engine "$engine" \
      --probe-file "$out/probe.json" $(args_for "$m") >"$out/model-$m.json"
  else
    # shellcheck disable=SC2046
    "$engine" --model "$m" $(args_for "$m") >"$out/model-$m.json"
  fi
done
if [ $have_torch = 1 ]; then
  echo "== SFT and DPO steps beside the DAPO update, ours (bench_methods) alternately with PyTorch"
  for m in "${models[@]}"; do
    # shellcheck disable=SC2046
    /usr/bin/python3 bench/bench_torch.py --model "$m" --engine "$engine" \
      --methods build/bench/bench_methods --probe-file "$out/probe.json" \
      $(args_for "$m" | cut -d' ' -f1-2) >"$out/methods-$m.json"
  done
fi
echo "== SGEMM peak again"
"$engine" --sgemm >"$out/sgemm-end.json"
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 bench/bench_torch.py --report "$out"/*.json
else
  python3 bench/bench_torch.py --report "$out"/*.json
fi
echo "== tokenizers: ours vs Hugging Face tokenizers (bench/tokenizer.sh, MB/s)"
bench/tokenizer.sh build 20000 || echo "bench/tokenizer.sh failed (npm offline?)"
