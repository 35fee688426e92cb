#!/usr/bin/env bash
# Kill -9 at random moments while checkpoints are being written: a 2-rank
# run saving every step (background saves), killed N times at a random
# delay; after each kill the newest visible checkpoint must verify (every
# shard's CRC-32, every tensor covered) and every 10th kill a resume from it
# must run. Prints how many kills landed inside a save (a .tmp directory
# was left behind) and the verdict; writes bench/results/kill_during_saves.json.
# Usage: bench/kill_during_saves.sh [KILLS=100] [CONFIG=tests/configs/zaya-tiny.json]
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-100}; config=${2:-tests/configs/zaya-tiny.json}
anvil=$PWD/build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(--config "$config" --set vocab_size=256 --set d_model=128 -T 64 --peak-gflops 1
       --log-every 100000)
args=("${model[@]}" -B 4 --steps 100000 --ckpt-every 1 --keep 2)
run="$out/run"
in_save=0; bad=0; resumed=0
for i in $(seq 1 "$kills"); do
  resume=()
  [ -d "$run" ] && [ -n "$(ls -d "$run"/step-* 2>/dev/null)" ] && resume=(--resume latest)
  setsid mpirun --oversubscribe -np 2 "$anvil" train "${args[@]}" --out "$run" "${resume[@]}" \
    < /dev/null > "$out/log" 2>&1 &
  pid=$!
  # Long enough to start and write a few checkpoints, then anywhere.
  sleep "$(python3 -c "import random; print(round(1.5 + random.random() * 1.5, 3))")"
  kill -9 -- -"$pid" 2>/dev/null || true
  pkill -9 -f "$anvil train" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ls -d "$run"/.step-*.tmp-* > /dev/null 2>&1 && in_save=$((in_save + 1))
  newest=$(ls -d "$run"/step-* 2>/dev/null | sort | tail -1)
  if [ -z "$newest" ]; then continue; fi
  if ! "$anvil" ckpt verify "$newest" > "$out/verify" 2>&1; then
    bad=$((bad + 1)); echo "kill $i: $newest does not verify:" >&2; cat "$out/verify" >&2
  fi
  if [ $((i % 10)) -eq 0 ]; then
    # One more step on one rank (the same global batch: 8 rows).
    step=$(basename "$newest" | sed 's/step-0*//')
    if "$anvil" train "${model[@]}" -B 8 --steps $((step + 1)) --out "$out/probe" \
        --resume "$newest" --sync-save < /dev/null > "$out/probe.log" 2>&1; then
      resumed=$((resumed + 1))
    else
      bad=$((bad + 1)); echo "kill $i: resume from $newest failed" >&2; tail -3 "$out/probe.log" >&2
    fi
    rm -rf "$out/probe"
  fi
  echo "kill $i/$kills: newest $(basename "$newest")" >&2
done
echo "$kills kills (kill -9 of every process at a random moment, 1.5-3 s in; a save every step)"
echo "$in_save left an uncommitted save behind (the kill landed inside a save)"
echo "newest visible checkpoint failed to verify or resume: $bad times; resumed from it: $resumed of $((kills / 10)) tries"
mkdir -p bench/results
printf '{"kills": %d, "inside_a_save": %d, "failures": %d, "resumes": %d}\n' "$kills" "$in_save" "$bad" "$resumed" \
  > bench/results/kill_during_saves.json
[ "$bad" -eq 0 ]
