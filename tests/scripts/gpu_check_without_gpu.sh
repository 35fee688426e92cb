#!/usr/bin/env bash
# The GPU check (scripts/gpu-check.sh) where no GPU can be used: it must
# run to its end and fail every GPU step only for want of a device. A flag
# the CLI no longer takes, a path that moved or a shell error would fail a
# step another way, and would otherwise first show on a GPU machine, whose
# time is short. Also: GPU_CHECK_PACK writes the pack. Exits 77 (skipped)
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
done < <(grep "^FAILED" "$work/check.log" | grep -v ": not started, [a-z0-9-]* failed$")
[[ $(grep -c "^FAILED" "$work/check.log") -ge 10 ]] || { echo "expected the GPU steps to run"; bad=1; }
# Whole outputs into grep -q, never a pipe: under pipefail a writer still
# writing when grep has matched and gone dies of SIGPIPE, failing the test.
grep -q "out/hw.log" <<< "$(tar -tzf "$work/pack.tar.gz")" || { echo "GPU_CHECK_PACK: no pack"; bad=1; }
((bad == 0)) && echo "gpu-check without a GPU: every GPU step failed for want of a device only"
exit "$bad"
