#!/usr/bin/env bash
# Checkpoint stalls on this machine: the same run with no checkpoints, with
# background saves (the default) and with --sync-save, every EVERY steps,
# runs interleaved, medians of REPEATS. The stall per save is the extra wall
# time over the run without checkpoints divided by the saves; for background
# saves also the time the optimizer update waited for the writer
# (save_wait_s in metrics.jsonl) and the step after each save against the
# median step. Writes bench/results/async_save.json.
# Usage: bench/async_save.sh [REPEATS=3] [STEPS=9] [EVERY=2] [CONFIG=configs/gpt2-124m.json] [B=4] [T=256]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}; steps=${2:-9}; every=${3:-2}; config=${4:-configs/gpt2-124m.json}; B=${5:-4}; T=${6:-256}
anvil=$PWD/build/anvil
[ -x "$anvil" ] || scripts/build.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(train --config "$config" -B "$B" -T "$T" --steps "$steps" --peak-gflops 100 --log-every 1000)
for i in $(seq 1 "$repeats"); do
  for mode in none async sync; do
    extra=(); [ "$mode" != none ] && extra=(--out "$out/$mode-$i" --ckpt-every "$every")
    [ "$mode" = sync ] && extra+=(--sync-save)
    t0=$(date +%s.%N)
    "$anvil" "${common[@]}" "${extra[@]}" --json-out "$out/$mode-$i.json" > /dev/null
    t1=$(date +%s.%N)
    echo "$t0 $t1" > "$out/$mode-$i.wall"
  done
  echo "repeat $i done" >&2
done
mkdir -p bench/results
python3 - "$out" "$repeats" "$steps" "$every" "$config" "$B" "$T" <<'PY'
import json, statistics as st, sys
out, repeats, steps, every, config, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:]
R = range(1, repeats + 1)
wall = lambda m, i: (lambda a, b: b - a)(*map(float, open(f"{out}/{m}-{i}.wall").read().split()))
saves = (steps - 1) // every + 1  # every EVERY steps (not at the last) + the final one
step = st.median(st.median(json.load(open(f"{out}/none-{i}.json"))["step_seconds"][1:]) for i in R)
rows = {}
for m in ("async", "sync"):
    per = [(wall(m, i) - wall("none", i)) / saves for i in R]
    rows[m] = st.median(per)
waits, after = [], []
for i in R:
    for line in open(f"{out}/async-{i}/metrics.jsonl"):
        e = json.loads(line)
        if "save_wait_s" in e: waits.append(e["save_wait_s"])
    s = json.load(open(f"{out}/async-{i}.json"))["step_seconds"]
    after += [s[k] - step for k in range(every, len(s), every)]  # the steps right after a save
print(f"{config}, B={B} T={T}, {steps} steps, a checkpoint every {every} ({saves} saves), medians of {repeats} interleaved runs")
print(f"median step without checkpoints: {step:.3f} s")
print(f"synchronous save: {rows['sync']:.3f} s per save ({100 * rows['sync'] / step:.1f}% of a step)")
print(f"background save:  {rows['async']:.3f} s per save ({100 * rows['async'] / step:.1f}% of a step); "
      f"update waited {st.median(waits) if waits else 0:.3f} s (median); step after a save {st.median(after):+.3f} s")
json.dump({"config": config, "batch": int(B), "seq": int(T), "steps": steps, "every": every, "saves": saves,
           "step_s": step, "sync_save_s": rows["sync"], "async_stall_s": rows["async"],
           "async_update_wait_s": waits, "step_after_save_extra_s": after},
          open("bench/results/async_save.json.tmp", "w"), indent=2)
PY
mv bench/results/async_save.json.tmp bench/results/async_save.json
