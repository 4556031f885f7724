#!/usr/bin/env bash
# Runs every test: installs missing Debian packages, builds with CMake, runs the whole suite with
# ctest, then builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs the suite
# there too. This is the README's test command and exactly what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

echo "== build (RelWithDebInfo)"
bash scripts/setup.sh build
echo "== tests"
(cd build && ctest --output-on-failure --timeout 900 -j"$jobs")

echo "== build (ASan + UBSan)"
bash scripts/setup.sh build-asan -DDAPO_SANITIZE=ON
echo "== tests under ASan + UBSan"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd build-asan && ctest --output-on-failure --timeout 1800 -j"$jobs" -LE 'format')

echo "== fuzzing (libFuzzer, clang; ~30 s per target)"
# scripts/fuzz.sh builds tests/fuzz's targets in build-fuzz (clang, -DDAPO_FUZZ=ON) and runs each
# from its seed corpus; any crash fails the stage (longer runs: scripts/fuzz.sh SECONDS).
BUILD_DIR=build-fuzz bash scripts/fuzz.sh 30
