#!/usr/bin/env bash
# Builds anvil with a sanitizer in a folder of its own and runs the tests
# that suit it (the test command runs both; each is one line of output plus
# the findings):
#   scripts/sanitize.sh address   AddressSanitizer + UBSan (build-asan): every
#                                 unit test in-process (the tests that start
#                                 the anvil binary or mpirun are left to the
#                                 normal build: they would run instrumented
#                                 training for minutes; tests/CMakeLists.txt
#                                 leaves their files and the binary out of
#                                 this build, the filter the two straggler
#                                 tests that share a file with in-process ones)
#   scripts/sanitize.sh thread    ThreadSanitizer (build-tsan): the threaded
#                                 pieces, the comm progress thread and the
#                                 checkpoint writers, then two short training
#                                 runs (background saves; 2 ranks with ZeRO-1);
#                                 scripts/tsan.supp names what is not ours
# Extra arguments go to the test binary (e.g. --gtest_filter=Sharded.*).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}; shift || true
case "$kind" in
  address) dir=build-asan; sanitize=address,undefined
           filter='-Stragglers.ARank*:Stragglers.Exclude*' ;;
  thread)  dir=build-tsan; sanitize=thread
           filter='Sharded*:Faults*:AtomicWrite*' ;;
  *) echo "scripts/sanitize.sh: expected address or thread, got '$kind'" >&2; exit 2 ;;
esac
start=$(date +%s)
# Warnings are the normal build's job (-Werror there): instrumented code makes
# GCC 12 report false -Wmaybe-uninitialized inside libstdc++ (std::regex).
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DCMAKE_C_FLAGS_RELEASE=-O1 \
  -DANVIL_SANITIZE="$sanitize" -DANVIL_CUDA=off -DANVIL_WERROR=OFF -DANVIL_BUILD_TESTS=ON > /dev/null
targets=(anvil_tests); [ "$kind" = thread ] && targets+=(comm_tests anvil)
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}" > "$dir/build.log" 2>&1 ||
  { tail -30 "$dir/build.log" >&2; exit 1; }
built=$(date +%s)
# One thread per test process: findings are about anvil's threads, not OpenMP's pool
# (which TSan cannot see into).
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp
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
if [ "$kind" = thread ]; then
  # The background checkpoint writer and the overlapped gradient reduction in
  # real training runs (1 rank; 2 ranks with ZeRO-1), a save every 2 steps.
  text=$dir/tsan-text.txt
  python3 -c "import random, sys; random.seed(1); open(sys.argv[1], 'w').write(' '.join(
      random.choice('the and of to in that he was'.split()) for _ in range(20000)))" "$text"
  train=(train --config tests/configs/gpt2-tiny.json --set vocab_size=256 -B 2 -T 32 --steps 8
         --ckpt-every 2 --data "$text" --peak-gflops 1 --log-every 1000)
  rm -rf "$dir/run-1" "$dir/run-2"
  if ! "$dir/anvil" "${train[@]}" --out "$dir/run-1" >> "$dir/tests.log" 2>&1 ||
     ! "$(grep -oE '^MPIEXEC_EXECUTABLE:FILEPATH=.*' "$dir/CMakeCache.txt" | cut -d= -f2)" \
       --allow-run-as-root --oversubscribe -np 2 "$dir/anvil" "${train[@]}" --zero \
       --out "$dir/run-2" >> "$dir/tests.log" 2>&1; then
    grep -E "WARNING: ThreadSanitizer|SUMMARY" "$dir/tests.log" | head -20 >&2
    echo "sanitize thread: FINDINGS in a training run (log $dir/tests.log)" >&2
    exit 1
  fi
fi
done_at=$(date +%s)
ran=$(grep -oE '[0-9]+ tests? from [0-9]+ test suites? ran' "$dir/tests.log" | paste -sd+ | sed 's/+/ + /g')
[ "$kind" = thread ] && ran="$ran, 2 training runs"
echo "sanitize $kind: $ran, clean;" \
     "build $((built - start)) s, tests $((done_at - built)) s"
