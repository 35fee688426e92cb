#!/usr/bin/env bash
# The GPU check (scripts/gpu-check.sh) where no GPU can be used: it must
# run to its end and fail every GPU step only for want of a device. A flag
# the CLI no longer takes, a path that moved or a shell error would fail a
# step another way, and would otherwise first show on a GPU machine, whose
# time is short. Also: GPU_CHECK_PACK writes the pack, GPU_CHECK_ONLY and
# GPU_CHECK_SUMMARY do what they say, a stale bundle is refused. Exits 77 (skipped)
# where the build has no CUDA or a GPU can be used (the check runs for real
# there).
#
#   tests/scripts/gpu_check_without_gpu.sh BUILD_DIR WORK_DIR
set -uo pipefail
build=${1:?usage: gpu_check_without_gpu.sh BUILD_DIR WORK_DIR} work=${2:?WORK_DIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
hw=$("$build/anvil" hw --json) || exit 1
read -r built usable < <(python3 -c 'import json,sys; d=json.load(sys.stdin)
print(int(d["cuda_built"]), int(d["gpus"]["available"]))' <<< "$hw")
if ((!built)); then echo "skipped: built without CUDA"; exit 77; fi
if ((usable)); then echo "skipped: a GPU can be used here; run scripts/gpu-check.sh"; exit 77; fi

rm -rf "$work" && mkdir -p "$work"
ANVIL_BUILD_DIR=$build "$repo/scripts/gpu-bundle.sh" "$work/bundle.tar.xz" > "$work/bundle.log" 2>&1 ||
  { cat "$work/bundle.log"; exit 1; }
GPU_CHECK_PACK=$work/pack.tar.gz "$repo/scripts/gpu-check.sh" "$work/out" "$work/bundle.tar.xz" \
  > "$work/check.log" 2>&1
rc=$?
cat "$work/check.log"
bad=0
((rc == 1)) || { echo "expected exit 1 (GPU steps failed), got $rc"; bad=1; }
grep -q "^ok     gpu-tests" "$work/check.log" || { echo "gpu-tests: expected ok (all skipped)"; bad=1; }
grep -q "^ok     hw" "$work/check.log" || { echo "hw: expected ok"; bad=1; }
while read -r _ name _; do
  if ! grep -q "no CUDA device can be used" <<< "$(tail -n 1 "$work/out/$name.log")"; then
    echo "$name failed for another reason than the missing device:"
    tail -n 3 "$work/out/$name.log"
    bad=1
  fi
done < <(grep "^FAILED" "$work/check.log" | grep -v ": not started, it needs ")
[[ $(grep -c "^FAILED" "$work/check.log") -ge 10 ]] || { echo "expected the GPU steps to run"; bad=1; }
# Whole outputs into grep -q, never a pipe: under pipefail a writer still
# writing when grep has matched and gone dies of SIGPIPE, failing the test.
grep -q "out/hw.log" <<< "$(tar -tzf "$work/pack.tar.gz")" || { echo "GPU_CHECK_PACK: no pack"; bad=1; }

# GPU_CHECK_ONLY reruns the steps it names (a step that needs one not run
# is said as not started), GPU_CHECK_SUMMARY keeps a copy of the summary.
GPU_CHECK_ONLY="hw generate-gpt2-124m" GPU_CHECK_SUMMARY=$work/summary-copy.txt \
  "$repo/scripts/gpu-check.sh" "$work/only" "$work/bundle.tar.xz" > "$work/only.log" 2>&1
rc=$?
((rc == 1)) || { echo "GPU_CHECK_ONLY: expected exit 1, got $rc"; cat "$work/only.log"; bad=1; }
only=$(cat "$work/only.log")
grep -q "^ok     hw" <<< "$only" || { echo "GPU_CHECK_ONLY: expected hw ok"; bad=1; }
grep -q "^FAILED generate-gpt2-124m: not started, it needs train-gpt2-124m" <<< "$only" ||
  { echo "GPU_CHECK_ONLY: expected generate not started"; bad=1; }
[[ $(grep -c "^ok \|^FAILED" <<< "$only") == 2 ]] || { echo "GPU_CHECK_ONLY: expected 2 steps"; bad=1; }
grep -q "^skipped (GPU_CHECK_ONLY): gpu-tests " <<< "$only" || { echo "GPU_CHECK_ONLY: no skip line"; bad=1; }
cmp -s "$work/summary-copy.txt" "$work/only/summary.txt" || { echo "GPU_CHECK_SUMMARY: differs"; bad=1; }
grep -q 'rerun them with GPU_CHECK_ONLY="generate-gpt2-124m"' <<< "$only" ||
  { echo "GPU_CHECK_ONLY: no rerun line"; bad=1; }
GPU_CHECK_ONLY="hw bogus" "$repo/scripts/gpu-check.sh" "$work/bogus" "$work/bundle.tar.xz" \
  > "$work/bogus.log" 2>&1
rc=$?
((rc == 2)) && grep -q "no step 'bogus'" "$work/bogus.log" ||
  { echo "GPU_CHECK_ONLY: an unknown step is not refused (exit $rc)"; bad=1; }

# A bundle of other sources is refused before any step (exit 2).
mkdir -p "$work/stale" && tar -xJf "$work/bundle.tar.xz" -C "$work/stale" &&
  echo 0000000000000000 > "$work/stale/anvil/SOURCE_HASH" &&
  tar -C "$work/stale" -cf - anvil | xz -0 -T2 > "$work/stale.tar.xz"
"$repo/scripts/gpu-check.sh" "$work/stale-out" "$work/stale.tar.xz" > "$work/stale.log" 2>&1
rc=$?
((rc == 2)) || { echo "stale bundle: expected exit 2, got $rc"; bad=1; }
grep -q "^FAILED bundle: built from other sources" "$work/stale.log" ||
  { echo "stale bundle: expected the refusal"; cat "$work/stale.log"; bad=1; }
[[ ! -e $work/stale-out/hw.log ]] || { echo "stale bundle: a step ran"; bad=1; }

((bad == 0)) && echo "gpu-check without a GPU: every GPU step failed for want of a device only"
exit "$bad"
