#!/usr/bin/env bash
# Fault tolerance on this machine: a 2-rank run trained straight, then once
# per fault under `anvil launch` with that fault injected (kill, hang, nan,
# corrupt-ckpt, kill-in-save). Each faulted run must finish with no human
# action, lose at most one checkpoint interval, and end on the straight
# run's final weights and optimizer state bit for bit (anvil ckpt diff).
# Prints, per fault, the detection and restart times and the steps redone
# from the journal, and the run's goodput; writes bench/results/faults.json.
# Usage: bench/faults.sh [STEPS=60] [EVERY=10] [CONFIG=configs/zaya-small.json] [B=2] [T=128]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}; every=${2:-10}; config=${3:-configs/zaya-small.json}; B=${4:-2}; T=${5:-128}
anvil=$PWD/build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--config "$config" -B "$B" -T "$T" --steps "$steps" --ckpt-every "$every" --keep 3
      --peak-gflops 100 --log-every 1000 --seed 7)
mid=$((steps / 2 - every / 2))            # a step between checkpoints
at=$(( (steps / 2) / every * every ))     # a checkpoint step
echo "straight run ($steps steps)" >&2
mpirun --oversubscribe -np 2 "$anvil" train "${args[@]}" --out "$out/straight" < /dev/null > "$out/straight.log" 2>&1
last=$(printf "step-%08d" "$steps")
faults="kill@$mid:1 hang@$mid:1 nan@$mid:0 corrupt-ckpt@$at:1 kill-in-save@$at:0=300"
for f in $faults; do
  name=${f%%@*}
  echo "fault $f" >&2
  "$anvil" launch --np 2 --inject "$f" --hang-timeout 20 --backoff 1 -- "${args[@]}" \
    --out "$out/$name" < /dev/null > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; exit 1; }
  if "$anvil" ckpt diff "$out/$name/$last" "$out/straight/$last" > "$out/$name.diff"; then
    echo same > "$out/$name.same"
  else
    echo differ > "$out/$name.same"
  fi
done
mkdir -p bench/results
python3 - "$out" "$faults" "$every" "$steps" <<'PY'
import json, sys
out, faults, every, steps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
rows = []
print(f"anvil launch, 2 ranks, {steps} steps, a checkpoint every {every}; one fault per run")
print(f"{'fault':<24}{'detect s':>10}{'restart s':>11}{'redone':>8}{'redo s':>8}{'wall s':>9}{'goodput':>9}  final weights and state")
ok = True
for f in faults:
    name = f.split("@")[0]
    ev = [json.loads(l) for l in open(f"{out}/{name}/journal.jsonl")]
    fault = next(e for e in ev if e["event"] == "fault")
    rec = next(e for e in ev if e["event"] == "recovered")
    cu = next((e for e in ev if e["event"] == "caught-up"), {"recompute_s": 0})
    done = next(e for e in ev if e["event"] == "done")
    same = open(f"{out}/{name}.same").read().strip()
    redone = rec["recomputed_steps"]
    ok &= same == "same" and redone <= every and done["exit"] == 0
    print(f"{f:<24}{fault['detect_s']:>10.2f}{rec['restart_s']:>11.2f}{redone:>8}{cu['recompute_s']:>8.2f}"
          f"{done['wall_s']:>9.1f}{100 * done['goodput']:>8.1f}%  {'bit-identical' if same == 'same' else 'DIFFER'}")
    rows.append({"fault": f, "cause": fault["cause"], "detect_s": fault["detect_s"], "restart_s": rec["restart_s"],
                 "resumed_step": rec["resumed_step"], "redone_steps": redone, "recompute_s": cu["recompute_s"],
                 "wall_s": done["wall_s"], "useful_s": done["useful_s"], "goodput": done["goodput"],
                 "lost_s": done["lost_s"], "bit_identical": same == "same"})
json.dump({"steps": steps, "every": every, "rows": rows}, open("bench/results/faults.json.tmp", "w"), indent=2)
print("all faults recovered bit-identically within one interval" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
mv bench/results/faults.json.tmp bench/results/faults.json
