#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz. Builds them first (clang, -DDAPO_FUZZ=ON) in
# BUILD_DIR (default build-fuzz), then fuzzes each target for SECONDS (default 300) with its seed
# corpus (tests/fuzz/corpus/<t>, read only) plus a working corpus under BUILD_DIR/fuzz-work/<t>,
# the JSON dictionary, a 2 GiB RSS limit and a 10 s per-input timeout. A crash leaves its input
# in BUILD_DIR/fuzz-work/<t>/artifacts/ and fails the script: fix it, then copy the input to
# tests/fuzz/regressions/<t>/ so that the replay tests keep it.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (env BUILD_DIR, FUZZ_JOBS, FUZZ_SKIP_BUILD)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(dataset jobspec safetensors tokenizer judge_reply grader toolcall env_reply)
build=${BUILD_DIR:-build-fuzz}

command -v clang >/dev/null || { echo "fuzz.sh: clang is missing (scripts/setup.sh installs it)" >&2; exit 1; }
if [ -z "${FUZZ_SKIP_BUILD:-}" ]; then # FUZZ_SKIP_BUILD=1: fuzz the binaries already built
  CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDAPO_FUZZ=ON >/dev/null
  cmake --build "$build" -j"$(nproc)" --target fuzz_targets >/dev/null
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fail=0
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  mkdir -p "$work/corpus" "$work/artifacts"
  log="$work/fuzz.log"
  echo "== fuzz_$t for ${secs}s"
  if ! "$build/tests/fuzz/fuzz_$t" "$work/corpus" "tests/fuzz/corpus/$t" \
      -dict=tests/fuzz/dict/json.dict -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
      ${FUZZ_JOBS:+-jobs=$FUZZ_JOBS -workers=$FUZZ_JOBS} >"$log" 2>&1; then
    echo "fuzz_$t: FAILED (crash input in $work/artifacts/, log $log)" >&2
    grep -E "ERROR|FUZZ_CHECK|SUMMARY" "$log" | head -5 >&2 || true
    fail=1
  fi
  # the last status line (execs, coverage) and the final stats
  grep -E "^#[0-9]+" "$log" | tail -1 || true
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$log" || true
done
exit $fail
