#!/usr/bin/env bash
# The GPU check, on a machine with a CUDA GPU: unpacks the bundle that
# scripts/gpu-bundle.sh made and runs, correctness first:
#   - the GPU tests and `anvil hw`;
#   - training on the GPU against the CPU: gpt2-tiny and llama-tiny 20 steps
#     (fp32 with TF32 off: losses within 1e-4 relative; bf16: within 2e-2;
#     bench/loss_parity.py), gpt2-tiny with Muon stepping on the GPU (within
#     1e-3), and a bf16 run repeated on the GPU (the same losses, bit for bit);
#   - gpt2-124m (B=16, T=1024, bf16) for 30 steps (and whether its attention
#     ran fused), a sample from its checkpoint on the GPU (`generate`), and
#     PyTorch training the same model exported from anvil
#     (bench/torch_train_hf.py --device cuda, compiled where a C compiler is);
#   - then the benchmarks: the PyTorch baselines (bench/gpu_vs_torch.py:
#     torch.matmul and copy_ against anvil, interleaved, medians of 3),
#     `bench gemm` and `bench membw` at a reduced sweep, `hw --profile`,
#     `bench comm` (NCCL) on one rank, and last (the longest, compiling)
#     PyTorch training the gpt2-124m run's model;
# writing every log and JSON to OUT, and the ok / FAILED lines to
# OUT/summary.txt. Exits non-zero when any step fails.
#
#   scripts/gpu-check.sh OUT [BUNDLE]   default BUNDLE: gpu-bundle/anvil-gpu.tar.xz
#
# GPU_CHECK_SECONDS (default 360) bounds the whole check: each step's limit
# is cut to the time left, and a step with under 5 s left is not started
# (it counts as failed). GPU_CHECK_ONLY="STEP ..." runs only those steps
# (a second call reruns what failed; the others are said as skipped).
# GPU_CHECK_PACK=FILE also writes OUT as one .tar.gz on every exit, and
# GPU_CHECK_SUMMARY=FILE copies each summary line there as it is said: a
# host that hands back only a few files gets both, and a check killed from outside
# (no exit trap) still leaves its summary so far.
#
# The bundle must hold binaries built from this tree's sources (a hash of
# src/, apps/, tests/ and CMakeLists.txt, written by scripts/gpu-bundle.sh):
# any other bundle is refused before the GPU is touched (exit 2), unless
# GPU_CHECK_STALE_OK=1.
#
# The CUDA libraries are the machine's own: CUDA_HOME (or /usr/local/cuda)
# lib64, and PyTorch's nvidia-* wheels where it has them (NCCL, cuBLAS).
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${1:?usage: scripts/gpu-check.sh OUT [BUNDLE]}
bundle=${2:-gpu-bundle/anvil-gpu.tar.xz}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
work=$(mktemp -d)
pack=${GPU_CHECK_PACK:-}
on_exit() {
  rm -rf "$work"
  if [[ -n $pack ]]; then tar -czf "$pack" -C "$(dirname "$out")" "$(basename "$out")"; fi
}
trap on_exit EXIT
budget=${GPU_CHECK_SECONDS:-360}
deadline=$((SECONDS + budget))
summary_copy=${GPU_CHECK_SUMMARY:-}
: > "$out/summary.txt"
[[ -n $summary_copy ]] && : > "$summary_copy"
say() {
  echo "$*" | tee -a "$out/summary.txt"
  [[ -n $summary_copy ]] && echo "$*" >> "$summary_copy"
  return 0
}
# tar -J needs the xz program, which a minimal image may lack; Python's
# tarfile reads xz by itself.
if ! tar -xJf "$bundle" -C "$work" 2> "$out/unpack.log" &&
  ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$bundle" "$work" 2>> "$out/unpack.log"; then
  say "FAILED unpack: cannot unpack $bundle ($(tail -1 "$out/unpack.log"))"
  exit 2
fi
B=$work/anvil

# PyTorch's wheels first: anvil then loads the cuBLAS(Lt) that torch.matmul
# runs, and bench/gpu_vs_torch.py compares the callers, not two library
# versions.
libs=$B/lib
py=$(command -v python3 || true)
if [[ -n $py ]]; then
  for d in $("$py" - <<'PY' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for lib in sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib"))):
        print(lib)
PY
  ); do libs=$libs:$d; done
fi
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d $d ]] && libs=$libs:$d
done
# The driver's libcuda and libnvidia-ml: the system's folders, or a mount
# such as /usr/local/nvidia that only LD_LIBRARY_PATH may name
# (--library-path below replaces LD_LIBRARY_PATH, so it is kept at the end).
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
  /lib/x86_64-linux-gnu; do
  [[ -e $d/libcuda.so.1 ]] && libs=$libs:$d
done
libs=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "library path: $libs" > "$out/environment.txt"
built=$(cat "$B/SOURCE" 2>/dev/null || echo unknown)
echo "bundle built from: $built" >> "$out/environment.txt"
# Binaries built from other sources than this tree's check the wrong code;
# the copy of the tree on a GPU machine may have no .git, so the sources
# themselves are compared (scripts/source-hash.sh).
built_hash=$(cat "$B/SOURCE_HASH" 2>/dev/null || echo none)
here_hash=$("$repo/scripts/source-hash.sh" "$repo")
if [[ $built_hash != "$here_hash" ]]; then
  if [[ ${GPU_CHECK_STALE_OK:-0} == 1 ]]; then
    say "warning: the bundle's sources ($built, hash $built_hash) are not this tree's ($here_hash)"
  else
    say "FAILED bundle: built from other sources ($built, hash $built_hash; this tree $here_hash): rerun scripts/gpu-bundle.sh (GPU_CHECK_STALE_OK=1 runs it anyway)"
    exit 2
  fi
fi

# Every binary runs under the bundle's own loader and glibc.
loader=$(ls "$B"/lib/ld-linux-x86-64.so.* | head -1)
run_bin() { "$loader" --library-path "$libs" "$@"; }
anvil() { ANVIL_PROFILES=$B/profiles run_bin "$B/bin/anvil" "$@"; }
export -f run_bin anvil
export loader libs B

failed=()
skipped=()
steps="gpu-tests hw train-gpt2-tiny-fp32 train-gpt2-tiny-bf16 train-llama-tiny-fp32
  train-llama-tiny-bf16 train-gpt2-tiny-muon repeat-llama-tiny-bf16 train-gpt2-124m
  generate-gpt2-124m torch-baselines gemm membw profile comm torch-train-gpt2-124m"
only=${GPU_CHECK_ONLY:-}
for name in $only; do
  if [[ " $(echo $steps) " != *" $name "* ]]; then
    say "FAILED GPU_CHECK_ONLY: no step '$name' (the steps: $(echo $steps))"
    exit 2
  fi
done
wanted() {  # wanted NAME: true when GPU_CHECK_ONLY is unset or names it
  [[ -z $only || " $only " == *" $1 "* ]]
}
step() {  # step NAME LIMIT_S command...
  local name=$1 limit=$2
  shift 2
  if ! wanted "$name"; then
    skipped+=("$name")
    return
  fi
  local t0=$SECONDS left=$((deadline - SECONDS))
  if ((left < 5)); then
    say "FAILED $name: not started, the check's $budget s are spent"
    failed+=("$name")
    return
  fi
  ((limit > left)) && limit=$left
  # pipefail inside too: a step's `... | tee` fails when its command does.
  # -k: anvil train stops at its next step boundary on SIGTERM; a step hung
  # in a kernel or a collective never reaches one, and would hold the GPU
  # through the steps after it: SIGKILL 10 s later.
  if timeout -k 10 "$limit" bash -o pipefail -c "$*" > "$out/$name.log" 2>&1; then
    say "ok     $name ($((SECONDS - t0)) s)"
  else
    say "FAILED $name ($((SECONDS - t0)) s): see $name.log"
    failed+=("$name")
  fi
}

command -v nvidia-smi > /dev/null && timeout -k 5 20 nvidia-smi > "$out/nvidia-smi.txt" 2>&1
step gpu-tests 120 "run_bin $B/bin/anvil_gpu_tests --gtest_output=json:$out/gpu-tests.json"
if wanted gpu-tests && command -v nvidia-smi > /dev/null && grep -q "SKIPPED" "$out/gpu-tests.log"; then
  say "FAILED gpu-tests: skipped on a machine with nvidia-smi (see gpu-tests.log)"
  failed+=("gpu-tests")
fi
step hw 30 "anvil hw && anvil hw --json > $out/hw.json"
# torch_probe NAME [MODULES]: true when python3 has CUDA PyTorch (and
# MODULES); else NAME is said as skipped (no PyTorch) or, when the check's
# time is spent, as failed (not started).
torch_probe() {
  local left=$((deadline - SECONDS))
  if ((left < 5)); then
    say "FAILED $1: not started, the check's $budget s are spent"
    failed+=("$1")
    return 1
  fi
  ((left > 60)) && left=60
  if [[ -n $py ]] &&
    timeout -k 5 "$left" "$py" -c "import torch${2:+, $2}; assert torch.cuda.is_available()" 2>/dev/null; then
    return 0
  fi
  say "skipped $1: no python3 with CUDA PyTorch${2:+ and $2} (or its import took over $left s)" |
    tee "$out/$1.log"
  return 1
}

# Training: the CPU's losses against the GPU's on the same batches.
tiny="-T 64 -B 4 --steps 20 --lr 3e-3 --warmup 2 --log-every 5 --peak-gflops 1"
for m in gpt2-tiny llama-tiny; do
  for dt in fp32:1e-4 bf16:2e-2; do
    d=${dt%%:*} tol=${dt#*:}
    step "train-$m-$d" 120 "anvil train --config $repo/tests/configs/$m.json $tiny --dtype $d \
      --json-out $out/train-$m-$d-cpu.json && \
      anvil train --config $repo/tests/configs/$m.json $tiny --dtype $d --device cuda \
      --json-out $out/train-$m-$d-cuda.json && \
      ${py:-python3} $repo/bench/loss_parity.py $out/train-$m-$d-cpu.json \
      $out/train-$m-$d-cuda.json --tol $tol --label $m-$d | tee $out/train-$m-$d-parity.json"
  done
done
# Muon stepping on the GPU (optim/device_muon.hpp) against the host Muon.
step "train-gpt2-tiny-muon" 120 "anvil train --config $repo/tests/configs/gpt2-tiny.json $tiny \
  --optimizer muon --json-out $out/train-gpt2-tiny-muon-cpu.json && \
  anvil train --config $repo/tests/configs/gpt2-tiny.json $tiny --optimizer muon --device cuda \
  --json-out $out/train-gpt2-tiny-muon-cuda.json && \
  ${py:-python3} $repo/bench/loss_parity.py $out/train-gpt2-tiny-muon-cpu.json \
  $out/train-gpt2-tiny-muon-cuda.json --tol 1e-3 --label gpt2-tiny-muon | \
  tee $out/train-gpt2-tiny-muon-parity.json"
# The same bf16 run twice on the GPU (fused attention where cuDNN has it):
# the same losses, bit for bit.
step "repeat-llama-tiny-bf16" 60 "anvil train --config $repo/tests/configs/llama-tiny.json $tiny \
  --dtype bf16 --device cuda --json-out $out/repeat-llama-tiny-1.json && \
  anvil train --config $repo/tests/configs/llama-tiny.json $tiny --dtype bf16 --device cuda \
  --json-out $out/repeat-llama-tiny-2.json && \
  ${py:-python3} $repo/bench/loss_parity.py $out/repeat-llama-tiny-1.json \
  $out/repeat-llama-tiny-2.json --tol 0 --label llama-tiny-bf16-repeat"
step train-gpt2-124m 180 "anvil train --config $repo/configs/gpt2-124m.json --device cuda --dtype bf16 \
  -B 16 -T 1024 --steps 30 --log-every 5 --out $work/gpt2-124m --json-out $out/train-gpt2-124m.json"
# Whether its attention ran fused: the plan names it where cuDNN (and the
# libcudart its frontend loads) can run, and a shape cuDNN refuses falls back
# with a warning.
if wanted train-gpt2-124m && [[ " ${failed[*]-} " != *" train-gpt2-124m "* ]] &&
  { ! grep -q "^attention: cuDNN fused" "$out/train-gpt2-124m.log" ||
    grep -q "runs unfused" "$out/train-gpt2-124m.log"; }; then
  say "FAILED attention-fused-gpt2-124m: its attention ran unfused (train-gpt2-124m.log)"
  failed+=("attention-fused-gpt2-124m")
fi
# Decoding from that run's checkpoint, the KV cache on the GPU (tokens/s);
# this and the PyTorch run below need that checkpoint.
after() {  # after STEP NAME: true when STEP passed, else NAME counts as failed
  wanted "$2" || return 1
  if [[ " ${failed[*]-} " == *" $1 "* || " ${skipped[*]-} " == *" $1 "* ]]; then
    say "FAILED $2: not started, it needs $1 (failed or not run)"
    failed+=("$2")
    return 1
  fi
}
after train-gpt2-124m generate-gpt2-124m && \
  step generate-gpt2-124m 60 "anvil generate --checkpoint $work/gpt2-124m --prompt-tokens 464,3290 \
  --max-new 256 --temperature 0 --device cuda > $out/generate-gpt2-124m.txt"
# The benchmarks, the PyTorch comparison first (a target it misses is said
# as MISSED, not FAILED: the step itself worked).
if ! wanted torch-baselines; then
  skipped+=(torch-baselines)
elif torch_probe torch-baselines; then
  step torch-baselines 120 "$py $repo/bench/gpu_vs_torch.py --rounds 3 --out $out/torch-baselines.json"
  grep -h "MISSED" "$out/torch-baselines.log" | while read -r line; do say "MISSED torch-baselines: $line"; done
fi
step gemm 90 "anvil bench gemm --device cuda --dtype bf16,fp8,tf32 --sizes 4096,8192 \
  --algos 8 --min-time 0.05 --out $out/gemm.json"
step membw 60 "anvil bench membw --device cuda --min-time 0.05 --out $out/membw.json"
step profile 120 "anvil hw --profile $out/gpu-profile.json --device cuda --min-time 0.03"
step comm 60 "anvil bench comm --device cuda --op all -b 1K -e 64M -f 4 -n 10 --out $out/comm.json"
# PyTorch training the gpt2-124m run's model (its tokens/s against anvil's).
if ! wanted torch-train-gpt2-124m; then
  skipped+=(torch-train-gpt2-124m)
elif torch_probe torch-train-gpt2-124m transformers; then
  # torch.compile's Triton builds its launchers with a C compiler.
  compile=--compile
  if ! command -v cc > /dev/null && ! command -v gcc > /dev/null; then
    compile=
    say "note: no C compiler, so PyTorch trains eager (no torch.compile)"
  fi
  after train-gpt2-124m torch-train-gpt2-124m && step torch-train-gpt2-124m 180 "anvil ckpt export --checkpoint $work/gpt2-124m --out $work/gpt2-124m-hf && \
    $py $repo/bench/torch_train_hf.py --model $work/gpt2-124m-hf --device cuda $compile \
      --dtype bf16 -B 16 -T 1024 --steps 10 > $out/torch-train-gpt2-124m.json"
fi

((${#skipped[@]})) && say "skipped (GPU_CHECK_ONLY): ${skipped[*]-}"
if ((${#failed[@]})); then
  # Each failed step once, in order: what a second call reruns (the fused
  # attention check is the gpt2-124m run's).
  rerun=$(printf '%s\n' "${failed[@]}" | sed 's/^attention-fused-gpt2-124m$/train-gpt2-124m/' |
    awk '!seen[$0]++' | tr '\n' ' ')
  say "gpu-check: ${#failed[@]} failure(s); rerun them with GPU_CHECK_ONLY=\"${rerun% }\""
  exit 1
fi
say "gpu-check: every step passed; logs and JSON in $out"
