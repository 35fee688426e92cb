#!/usr/bin/env bash
# recipes/zaya-small-3phase.json on 2 ranks (mpirun -np 2): pretraining and
# annealing data parallel (dp 2), the context extension at T=4096 under
# context parallelism (cp 2). Then the resume check: a copy of the run cut
# back to its newest checkpoint inside the last phase (every later one
# removed, as a kill there leaves it) resumes with --resume latest, and each
# step's loss is compared with the run that never stopped. Prints a table
# per phase (steps, tokens, seq x batch, median tokens/s, validation loss at
# its end) and the resume's largest loss difference.
# Usage: bench/recipe_cp.sh [RUN=runs/recipe]
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-runs/recipe}
[ -x build/anvil ] || scripts/build.sh
scripts/corpus.sh > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$run" "$run-resumed"
mkdir -p "$(dirname "$run")"
start=$(date +%s)
mpirun --oversubscribe -np 2 build/anvil train --recipe recipes/zaya-small-3phase.json \
  --out "$run" --log-every 10 > "$run.log" 2>&1
wall=$(( $(date +%s) - start ))
# The newest checkpoint strictly inside the last phase.
cut=$(python3 - "$run" <<'PY'
import json, os, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
last = rows[-1]["phase"]
steps = [r["step"] for r in rows if r.get("phase") == last]
first, end = min(steps), max(steps)
ckpts = sorted(int(d[5:]) for d in os.listdir(run) if d.startswith("step-"))
print(max(s for s in ckpts if first <= s < end))
PY
)
cp -r "$run" "$run-resumed"
for d in "$run-resumed"/step-*; do
  [ "$((10#${d##*step-}))" -gt "$cut" ] && rm -rf "$d"
done
mpirun --oversubscribe -np 2 build/anvil train --recipe recipes/zaya-small-3phase.json \
  --out "$run-resumed" --resume latest --log-every 10 > "$run-resumed.log" 2>&1
python3 - "$run" "$cut" "$wall" <<'PY'
import json, statistics, sys
run, cut, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = lambda d: [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
rows, resumed = load(run), load(run + "-resumed")
recipe = json.load(open("recipes/zaya-small-3phase.json"))
print(f"recipe {recipe['name']} on 2 ranks: {wall // 60} min {wall % 60} s end to end")
print(f"{'phase':<18} {'steps':>9} {'tokens':>8} {'seq x batch x accum, cp':>24} {'tok/s':>7} {'val loss':>9}")
phases = []
for p in recipe["phases"]:
    mine = [r for r in rows if r.get("phase") == p["name"]]
    val = [r["val_loss"] for r in mine if "val_loss" in r]
    tokens = mine[-1]["tokens"] - (phases[-1]["tokens_end"] if phases else 0)
    shape = f"{p['seq']} x {p.get('batch', recipe.get('batch', 4))} x {p.get('accum', 1)}, cp {p.get('cp', 1)}"
    tps = statistics.median(r["tokens_per_s"] for r in mine[1:] or mine)
    print(f"{p['name']:<18} {mine[0]['step']:>4}-{mine[-1]['step']:<4} {tokens:>8} {shape:>24} {tps:7.0f} "
          f"{(f'{val[-1]:.3f}' if val else '-'):>9}")
    phases.append({"name": p["name"], "first_step": mine[0]["step"], "last_step": mine[-1]["step"],
                   "tokens": tokens, "tokens_end": mine[-1]["tokens"], "tokens_per_s": tps,
                   "val_loss": val[-1] if val else None})
want = {r["step"]: r["loss"] for r in rows}
got = {r["step"]: r["loss"] for r in resumed if r["step"] > cut}
assert got and max(got) == max(want), "the resumed run did not reach the last step"
diff = max(abs(got[s] - want[s]) for s in got)
print(f"resumed from step {cut} (inside '{rows[-1]['phase']}'): steps {min(got)}-{max(got)}, "
      f"largest |loss difference| {diff:.3g}{' (identical)' if diff == 0 else ''}")
json.dump({"wall_s": wall, "phases": phases, "resumed_from": cut, "resumed_steps": len(got),
           "max_loss_difference": diff},
          open("bench/results/recipe_cp.json", "w"), indent=1)
PY
