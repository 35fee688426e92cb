#!/usr/bin/env bash
# The runs whose results the golden replay pins (tests/golden/README.md):
# small trainings of gpt2-tiny, llama-tiny and zaya-tiny on one rank and on
# two (data parallel, ZeRO-1, expert parallel), a save + resume, greedy
# generation (sampled, seeded) and a Hugging Face export. Only flags that every anvil since the
# recording accepts are used, so the recording binary and today's run the
# same lines.
# Usage: scenarios.sh ANVIL SOURCE_DIR WORK_DIR [MPIRUN]
# Writes WORK_DIR/NAME/{losses.json, tokens.txt, ckpt/, hf/} per scenario.
set -euo pipefail
anvil=$1; src=$2; work=$3; mpirun=${4:-mpirun}
cfg=$src/tests/configs
text=$src/tests/golden/text.txt  # frozen: the recording trained on it
export OMP_NUM_THREADS=2 ANVIL_SHM_CMA=1
mkdir -p "$work"

# NAME RANKS TRAIN-ARGS...: trains into WORK/NAME/run, keeps the losses and
# the newest checkpoint.
train() {
  local name=$1 np=$2; shift 2
  local dir=$work/$name
  rm -rf "$dir" && mkdir -p "$dir"
  if [ "$np" -gt 1 ]; then
    OMP_NUM_THREADS=1 "$mpirun" --allow-run-as-root --oversubscribe -np "$np" \
      "$anvil" train "$@" --out "$dir/run" --json-out "$dir/train.json" --peak-gflops 100 \
      > "$dir/log.txt" 2>&1
  else
    "$anvil" train "$@" --out "$dir/run" --json-out "$dir/train.json" --peak-gflops 100 \
      > "$dir/log.txt" 2>&1
  fi
  "$src/tests/golden/losses.py" "$dir/train.json" > "$dir/losses.json"
  local newest
  newest=$(ls -d "$dir"/run/step-* | sort | tail -n 1)
  cp -r "$newest" "$dir/ckpt"
}

# NAME: greedy tokens after a fixed prompt, from WORK/NAME/run.
generate() {
  "$anvil" generate --checkpoint "$work/$1/run" --prompt-tokens 10,20,30,40 --max-new 24 \
    --temperature 0.9 --top-k 20 --seed 3 > "$work/$1/tokens.txt" 2> /dev/null
}

# NAME: the Hugging Face export of WORK/NAME/run.
export_hf() {
  "$anvil" ckpt export --checkpoint "$work/$1/run" --out "$work/$1/hf" > /dev/null 2>&1
}

common=(--data "$text" --set vocab_size=256 -B 4 -T 32 --seed 7 --lr 3e-3 --warmup 2
        --val-every 3 --val-batches 4)

train gpt2 1 --config "$cfg/gpt2-tiny.json" "${common[@]}" --steps 6
generate gpt2
export_hf gpt2

train llama 1 --config "$cfg/llama-tiny.json" "${common[@]}" --set rotary_dim=16 --steps 6 \
  --optimizer muon
generate llama
export_hf llama

train zaya 1 --config "$cfg/zaya-tiny.json" "${common[@]}" --set skip_output=zero --steps 6
generate zaya
export_hf zaya

train zaya-bf16 1 --config "$cfg/zaya-tiny.json" "${common[@]}" --steps 4 --precision bf16

# Save at step 3 of 6, stop, resume: the resumed half and its checkpoint.
train resume 1 --config "$cfg/zaya-tiny.json" "${common[@]}" --steps 3 --optimizer muon \
  --schedule cosine
rm -rf "$work/resume/ckpt"
mv "$work/resume/train.json" "$work/resume/first-half.json"
"$anvil" train --config "$cfg/zaya-tiny.json" "${common[@]}" --steps 6 --optimizer muon \
  --out "$work/resume/run" --resume latest --json-out "$work/resume/train.json" \
  --peak-gflops 100 >> "$work/resume/log.txt" 2>&1
"$src/tests/golden/losses.py" "$work/resume/train.json" > "$work/resume/losses.json"
cp -r "$(ls -d "$work"/resume/run/step-* | sort | tail -n 1)" "$work/resume/ckpt"

train dp2 2 --config "$cfg/llama-tiny.json" "${common[@]}" --steps 5
train zero2 2 --config "$cfg/gpt2-tiny.json" "${common[@]}" --steps 5 --zero
train ep2 2 --config "$cfg/zaya-tiny.json" "${common[@]}" --steps 5 --set n_experts=4 --ep 2
