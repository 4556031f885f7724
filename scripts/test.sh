#!/usr/bin/env bash
# Runs every test: installs missing Debian packages, builds with CMake, runs the whole suite with
# ctest, then builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs the suite
# there too, then the server/worker tests under ThreadSanitizer (build-tsan), then the MPI tests
# against MPICH (build-mpich), then a short fuzz run. This is the README's test command and
# exactly what .ci/run calls.
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

echo "== build (ThreadSanitizer)"
bash scripts/setup.sh build-tsan -DDAPO_TSAN=ON
echo "== server and worker tests under ThreadSanitizer"
# The tests that run threads of ours: the daemon (labels api and security; openapi_lint only lints
# YAML; tests also labelled torch or slow are numeric and too slow under TSan), the
# bus/store/HTTP unit tests, the pool's and the sampler's (its pool splits decoding steps with
# barriers), the tools' (their calls run on threads of their own), the episodes' (the runner
# taking their answers; test_openenv also the OpenEnv sessions' socket thread), and the daemon
# relaying a multi-process job's events from its launcher (mpi_jobs).
# Any report fails the stage: halt_on_error stops the process, and every report is also written under build-tsan/tsan (log_path), which must stay
# empty. tests/security/tsan.supp lists races inside uninstrumented libraries only.
rm -rf build-tsan/tsan && mkdir -p build-tsan/tsan
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/security/tsan.supp:log_path=$PWD/build-tsan/tsan/report}
tsan_rc=0
(cd build-tsan && ctest --output-on-failure --timeout 1800 -j"$jobs" \
  -R '^(test_bus|test_store|test_api_units|test_pool|test_sampler|test_tools|test_episodes|test_openenv|security_judge_ssrf|mpi_jobs)$') || tsan_rc=1
(cd build-tsan && ctest --output-on-failure --timeout 1800 -j"$jobs" -L 'api|security' \
  -LE 'torch|slow' -E '^(openapi_lint|security_judge_ssrf)$') || tsan_rc=1
if [ -n "$(ls -A build-tsan/tsan)" ]; then
  echo "ThreadSanitizer reports:" >&2
  cat build-tsan/tsan/* >&2
  tsan_rc=1
fi
unset TSAN_OPTIONS
[ "$tsan_rc" -eq 0 ] || exit 1

echo "== build (MPICH) and the MPI tests against it"
# The default build uses Open MPI (the mpicc alternative); dapod uses only standard MPI calls, so
# the data-parallel tests run once more against MPICH (docs/SCALE.md). Only what they need.
cmake -S . -B build-mpich -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPI_C_COMPILER=/usr/bin/mpicc.mpich \
  -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich >/dev/null
cmake --build build-mpich -j"$jobs" --target dapod
(cd build-mpich && ctest --output-on-failure --timeout 900 -j"$jobs" -L mpi)

echo "== fuzzing (libFuzzer, clang; ~30 s per target)"
# scripts/fuzz.sh builds tests/fuzz's targets in build-fuzz (clang, -DDAPO_FUZZ=ON) and runs each
# from its seed corpus; any crash fails the stage (longer runs: scripts/fuzz.sh SECONDS).
BUILD_DIR=build-fuzz bash scripts/fuzz.sh 30
