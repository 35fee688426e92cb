#!/usr/bin/env bash
# Builds anvil with a sanitizer in a folder of its own and runs the tests
# that suit it (the test command runs both; each is one line of output plus
# the findings):
#   scripts/sanitize.sh address   AddressSanitizer + UBSan (build-asan): every
#                                 unit test in-process (the tests that start
#                                 the anvil binary or mpirun are left to the
#                                 normal build: they would run instrumented
#                                 training for minutes)
#   scripts/sanitize.sh thread    ThreadSanitizer (build-tsan): the threaded
#                                 pieces, the comm progress thread and the
#                                 checkpoint writers
# Extra arguments go to the test binary (e.g. --gtest_filter=Sharded.*).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}; shift || true
case "$kind" in
  address) dir=build-asan; sanitize=address,undefined
           filter='-Cli*:DataParallel*:ContextParallel.*:DiskFull*:Stragglers.ARank*:Stragglers.Exclude*' ;;
  thread)  dir=build-tsan; sanitize=thread
           filter='Sharded*:Faults*:AtomicWrite*' ;;
  *) echo "scripts/sanitize.sh: expected address or thread, got '$kind'" >&2; exit 2 ;;
esac
start=$(date +%s)
# Warnings are the normal build's job (-Werror there): instrumented code makes
# GCC 12 report false -Wmaybe-uninitialized inside libstdc++ (std::regex).
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DCMAKE_C_FLAGS_RELEASE=-O1 \
  -DANVIL_SANITIZE="$sanitize" -DANVIL_CUDA=off -DANVIL_WERROR=OFF -DANVIL_BUILD_TESTS=ON > /dev/null
targets=(anvil_tests); [ "$kind" = thread ] && targets+=(comm_tests)
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}" > "$dir/build.log" 2>&1 ||
  { tail -30 "$dir/build.log" >&2; exit 1; }
built=$(date +%s)
# One thread per test process: findings are about anvil's threads, not OpenMP's pool
# (which TSan cannot see into).
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
if ! "$dir/tests/anvil_tests" --gtest_filter="$filter" "$@" > "$dir/tests.log" 2>&1; then
  grep -E "ERROR: |runtime error|WARNING: ThreadSanitizer|FAILED" "$dir/tests.log" | head -20 >&2
  echo "sanitize $kind: FINDINGS (log $dir/tests.log)" >&2
  exit 1
fi
if [ "$kind" = thread ] && ! "$(grep -oE '^MPIEXEC_EXECUTABLE:FILEPATH=.*' "$dir/CMakeCache.txt" | cut -d= -f2)" \
    --allow-run-as-root --oversubscribe -np 2 "$dir/tests/comm_tests" --gtest_filter='*Async*' \
    >> "$dir/tests.log" 2>&1; then
  grep -E "WARNING: ThreadSanitizer|FAILED" "$dir/tests.log" | head -20 >&2
  echo "sanitize thread: FINDINGS in the comm progress thread (log $dir/tests.log)" >&2
  exit 1
fi
done_at=$(date +%s)
echo "sanitize $kind: $(grep -oE '[0-9]+ tests? from [0-9]+ test suites? ran' "$dir/tests.log" | tail -1), clean;" \
     "build $((built - start)) s, tests $((done_at - built)) s"
