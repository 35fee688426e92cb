#!/usr/bin/env bash
# `anvil plan` against measurement on this machine: in-sample and held-out.
#
# Each round measures this machine's profile (anvil hw --profile), a grid of
# GEMM shapes into it (anvil bench gemm --preset grid: the efficiency surface)
# and the 2-rank collectives (anvil bench comm --profile at 256K, 512K, 1M,
# ... 64M, with --refine 1.5: two more sizes, at 1/3 and 2/3 of the interval
# in log scale, wherever time per byte steps up by more than 1.5x, twice
# over). A second copy of the profile also gets the in-sample presets' own
# GEMM shapes (anvil bench gemm --preset model). Then it trains every case and
# measures the collectives again at every size from 256K to 128M by sqrt(2)
# and at the profile's refined sizes, in 3 passes over the sizes.
#
# In-sample:  the presets predicted from the profile holding their own GEMM
#             shapes; collectives at the measured sizes.
# Held-out:   the same presets from the grid alone (their shapes never
#             measured); configurations with other widths, sequence lengths
#             and expert counts, Muon (fp32 and bf16 Newton-Schulz) and
#             2-rank runs, none of whose shapes or steps went into the
#             profile; collectives at the sizes between
#             (the sqrt(2) steps: 362K, 724K, ... 90M; refinement cuts in
#             thirds, so it never measures them) and beyond the profile's
#             (128M).
# Rounds interleave, so machine drift hits prediction and measurement alike.
# Prints medians of predicted / measured, the in-sample and held-out errors
# separately, and writes bench/results/plan_validation.json.
# Collectives are predicted twice: from the round's profile (another bench
# comm run) and from the measurement's own run keeping only the profile's
# sizes, which isolates the interpolation from run-to-run spread.
# RESULT=FILE writes the JSON there instead of bench/results/plan_validation.json.
# COLLECTIVES_ONLY=1 skips the GEMMs and the training (a quick check);
# STEPS_ONLY=1 skips the held-out collective sweep (the profile's own sweep
# stays: the 2-rank cases are priced from it).
# GEMM rates pool 3 passes over the shapes (--passes 3, 0.05 s each): a
# slow spell of this shared VM (tens of seconds at half speed) otherwise
# lands on a run of neighbouring grid shapes and moves whole cells by 2x.
# Usage: [KEEP=DIR | ANALYSE=DIR [REPLAN=1]] bench/plan_validation.sh [ROUNDS (default 3)] [STEPS (default 6)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-6}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
export OMP_NUM_THREADS=$cores
half=$((cores / 2)); [ "$half" -ge 1 ] || half=1
# KEEP=DIR keeps the measurements there; ANALYSE=DIR re-prints a kept run
# (REPLAN=1: priced again by this build, below).
if [ -n "${ANALYSE:-}" ]; then
  out=$ANALYSE
elif [ -n "${KEEP:-}" ]; then
  out=$KEEP; mkdir -p "$out"
else
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi
# name|kind|config|B (per rank)|T|precision|ranks|--set overrides
cases="gpt2-124m|in|gpt2-124m|4|256|fp32|1|
llama-style|in|llama-style|4|256|fp32|1|
byte-small|in|byte-small|16|256|fp32|1|
gpt2-124m-bf16|in|gpt2-124m|4|256|bf16|1|
zaya-small|in|zaya-small|8|256|fp32|1|
gpt2-d640|held|gpt2-124m|4|256|fp32|1|--set d_model=640 --set n_heads=10 --set n_kv_heads=10 --set ffn_hidden=2560
gpt2-d640-bf16|held|gpt2-124m|4|256|bf16|1|--set d_model=640 --set n_heads=10 --set n_kv_heads=10 --set ffn_hidden=2560
llama-T384|held|llama-style|3|384|fp32|1|
byte-d512-T512|held|byte-small|8|512|fp32|1|--set d_model=512 --set n_heads=8 --set ffn_hidden=1536 --set seq_len=512
zaya-e8-f768|held|zaya-small|8|256|fp32|1|--set n_experts=8 --set expert_ffn_hidden=768
zaya-T512|held|zaya-small|4|512|fp32|1|--set seq_len=512
zaya-muon|held|zaya-small|8|256|fp32|1|--optimizer muon
zaya-muon-bf16|held|zaya-small|8|256|fp32|1|--optimizer muon --muon-bf16
gpt2-dp2|held|gpt2-124m|2|256|fp32|2|
zaya-dp2|held|zaya-small|4|256|fp32|2|"
# Keep in profile $1's collective fits only the sizes that profile $2 holds
# for the same op and algorithm (within 0.1%: the sqrt(2) sweep rounds 512K
# to 524284 bytes), and redo each alpha-beta fit without the others.
keep_profile_sizes() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
path, ref_path = sys.argv[1], sys.argv[2]
p, ref = json.load(open(path)), json.load(open(ref_path))
for ranks, ops in p["comm"]["ranks"].items():
    for op, algos in ops.items():
        for algo, fit in algos.items():
            keep = [b for b, _ in ref["comm"]["ranks"][ranks][op][algo]["points"]]
            pts = sorted(x for x in fit.get("points", [])
                         if any(abs(x[0] - b) <= 1e-3 * b for b in keep))
            fit["points"] = pts
            n = len(pts)
            mx = sum(b for b, _ in pts) / n
            my = sum(t for _, t in pts) / n
            slope = sum((b - mx) * (t - my) for b, t in pts) / sum((b - mx) ** 2 for b, _ in pts)
            fit["alpha_us"] = max(0.0, my - slope * mx)
            fit["bandwidth_gbs"] = 1e-3 / slope if slope > 0 else fit["bandwidth_gbs"]
json.dump(p, open(path, "w"), indent=2)
PY
}
# The sizes a profile's refinement added (off the 2x grid), comma-separated.
refined_sizes() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
sizes = {b for ops in p["comm"]["ranks"].values() for algos in ops.values()
         for fit in algos.values() for b, _ in fit.get("points", [])}
print(",".join(str(b) for b in sorted(sizes) if b & (b - 1)))
PY
}
comm_ops="--op allreduce reduce_scatter allgather --algo shm ring"
# The profile: 2x steps from 256K to 64M, refined at cache steps. The
# measurement: sqrt(2) steps from 256K to 128M. 3 passes over the sizes pool
# each size's samples, so a slow spell of this shared VM does not land on a
# few sizes.
profile_sweep="-b 256K -e 64M -f 2 -n 4 -w 2 --passes 3 --refine 1.5"
comm_sweep="-b 256K -e 128M -f 1.41421356 -n 4 -w 2 --passes 3"
# One case of round r priced from the round's grid profile (held-out) and,
# for in-sample cases, from the profile holding their own shapes.
price_case() {  # round name kind config B T prec np sets
  local dtype=f32; [ "$7" = bf16 ] && dtype=bf16
  # shellcheck disable=SC2206
  local pflags=(--config "configs/$4.json" $9 --micro-batch "$5" --seq "$6" --dtype "$dtype"
                --dp "$8" --json)
  "$anvil" plan --hw "$out/grid-$1.json" "${pflags[@]}" > "$out/plan-grid-$2-$1.json"
  [ "$3" != in ] ||
    "$anvil" plan --hw "$out/shapes-$1.json" "${pflags[@]}" > "$out/plan-shapes-$2-$1.json"
}
# ANALYSE=DIR REPLAN=1 prices a kept run's cases again with this build's
# anvil plan, from the profiles the run measured (the measurements stay).
if [ -n "${ANALYSE:-}" ] && [ -n "${REPLAN:-}" ]; then
  for r in $(seq 1 "$rounds"); do
    while IFS='|' read -r name kind config B T prec np sets; do
      price_case "$r" "$name" "$kind" "$config" "$B" "$T" "$prec" "$np" "$sets"
    done <<< "$cases"
  done
fi
# FIRST_ROUND=N (with KEEP) continues a kept run from round N.
for r in $(seq "${FIRST_ROUND:-1}" "$rounds"); do
  [ -z "${ANALYSE:-}" ] || break
  echo "round $r/$rounds: profile, GEMM grid, collectives" >&2
  grid="$out/grid-$r.json"   # held-out basis: the grid, no model shape
  shapes="$out/shapes-$r.json"  # in-sample: the grid plus the presets' own shapes
  "$anvil" hw --profile "$grid" --min-time 0.1 > /dev/null
  cp "$grid" "$out/same-$r.json"  # the measurement pass's own profile, below
  [ -n "${COLLECTIVES_ONLY:-}" ] ||
    "$anvil" bench gemm --preset grid --dtype f32,bf16 --baselines none --min-time 0.05 \
      --passes 3 --profile "$grid" > /dev/null
  "$anvil" bench comm --np 2 $comm_ops $profile_sweep --profile "$grid" > /dev/null
  cp "$grid" "$shapes"
  while IFS='|' read -r name kind config B T prec np sets; do
    [ "$kind" = in ] && [ -z "${COLLECTIVES_ONLY:-}" ] || continue
    dtype=f32; [ "$prec" = bf16 ] && dtype=bf16
    "$anvil" bench gemm --preset model --config "configs/$config.json" --tokens $((B * T)) \
      --backward --dtype "$dtype" --baselines none --min-time 0.05 --passes 3 \
      --profile "$shapes" > /dev/null
  done <<< "$cases"
  if [ -z "${STEPS_ONLY:-}" ]; then
    echo "round $r/$rounds: collectives at held-out sizes" >&2
    refined=$(refined_sizes "$grid")
    "$anvil" bench comm --np 2 $comm_ops $comm_sweep ${refined:+--add-sizes "$refined"} --json \
      --profile "$out/same-$r.json" > "$out/comm-$r.json"
    keep_profile_sizes "$out/same-$r.json" "$grid"
  fi
  while IFS='|' read -r name kind config B T prec np sets; do
    [ -z "${COLLECTIVES_ONLY:-}" ] || continue
    echo "round $r/$rounds: train $name ($np rank(s), B=$B T=$T $prec, $steps steps)" >&2
    flags=(--config "configs/$config.json" $sets)
    if [ "$np" = 1 ]; then
      "$anvil" train "${flags[@]}" -B "$B" -T "$T" --steps "$steps" --precision "$prec" \
        --log-every 1000 --json-out "$out/train-$name-$r.json" < /dev/null > /dev/null
    else
      OMP_NUM_THREADS=$half mpirun --oversubscribe -np "$np" "$anvil" train "${flags[@]}" \
        -B "$B" -T "$T" --steps "$steps" --precision "$prec" --log-every 1000 \
        --json-out "$out/train-$name-$r.json" < /dev/null > /dev/null
    fi
    price_case "$r" "$name" "$kind" "$config" "$B" "$T" "$prec" "$np" "$sets"
  done <<< "$cases"
  [ -z "${STEPS_ONLY:-}" ] || continue
  comm_sizes=$(/usr/bin/python3 -c 'import json, sys
print(",".join(str(b) for b in sorted({p["bytes"] for p in json.load(open(sys.argv[1]))["points"]})))' \
    "$out/comm-$r.json")
  for op in allreduce reduce_scatter allgather; do
    for algo in shm ring; do
      for basis in grid same; do
        "$anvil" plan comm --hw "$out/$basis-$r.json" --op "$op" --algo "$algo" --ranks 2 \
          --sizes "$comm_sizes" --json \
          > "$out/pcomm-$basis-$op-$algo-$r.json"
      done
    done
  done
done
mkdir -p bench/results
result=${RESULT:-bench/results/plan_validation.json}
/usr/bin/python3 - "$out" "$rounds" "$cases" "$result" <<'PY'
import json, statistics as st, sys
out, rounds, cases, result = sys.argv[1], int(sys.argv[2]), sys.argv[3].splitlines(), sys.argv[4]
R = range(1, rounds + 1)
load = lambda f: json.load(open(f"{out}/{f}"))
rows = []
def step_row(name, kind, basis, B, T, prec, np_):
    tr = [load(f"train-{name}-{r}.json") for r in R]
    pl = [load(f"plan-{basis}-{name}-{r}.json") for r in R]
    meas = [st.median(t["step_seconds"][1:]) for t in tr]
    pred = [p["step_s"] for p in pl]
    rss = [max(t.get("rank_peak_rss_bytes") or [t["peak_rss_bytes"]]) for t in tr]
    mem = [p["memory_bytes"]["total"] for p in pl]
    ratio = st.median(p / m for p, m in zip(pred, meas))
    return {"kind": "step", "sample": kind, "basis": basis, "case": name, "micro_batch": int(B),
            "seq": int(T), "precision": prec, "ranks": int(np_), "measured_s": meas,
            "predicted_s": pred, "ratio": ratio, "peak_rss_bytes": rss,
            "predicted_memory_bytes": mem, "memory_ratio": st.median(m / s for m, s in zip(mem, rss))}
print(f"anvil plan vs measured on this machine; medians over {rounds} rounds (profile re-measured each round)")
hdr = (f"{'case':<16}{'sample':>9}{'priced from':>13}{'ranks':>6}{'B x T':>9}{'prec':>6}{'measured s':>12}"
       f"{'predicted':>11}{'pred/meas':>11}{'peak RSS GB':>13}{'pred/RSS':>10}")
print(hdr)
import os
for line in cases:
    name, kind, config, B, T, prec, np_, sets = line.split("|")
    if not os.path.exists(f"{out}/train-{name}-1.json"):
        continue  # COLLECTIVES_ONLY
    bases = ["shapes", "grid"] if kind == "in" else ["grid"]
    for basis in bases:
        sample = "in" if basis == "shapes" else "held-out"
        row = step_row(name, sample, basis, B, T, prec, np_)
        row["config"], row["set"] = config, sets
        rows.append(row)
        print(f"{name:<16}{sample:>9}{'own shapes' if basis == 'shapes' else 'GEMM grid':>13}{np_:>6}"
              f"{B + 'x' + T:>9}{prec:>6}{st.median(row['measured_s']):>12.3f}"
              f"{st.median(row['predicted_s']):>11.3f}{row['ratio']:>11.2f}"
              f"{st.median(row['peak_rss_bytes']) / 1e9:>13.3f}{row['memory_ratio']:>10.2f}")
print()
# Term by term (one-rank cases whose runs report their step parts): the
# planner's GEMMs (experts apart), attention, the rest of the layer work
# (element-wise, dispatch and combine) and the optimizer step against the
# trainer's measured parts (anvil train's "parts_s"; docs/train.md).
def plan_parts(p):
    acc = {"gemm": 0.0, "attention": 0.0, "experts": 0.0, "other": 0.0}
    for part in p["compute"]:
        n = part["name"]
        key = ("attention" if n == "attention" else "experts" if n.startswith("expert.")
               else "other" if n in ("element-wise", "moe dispatch + combine", "fp8 casts",
                                                "bf16 input conversions", "gradient zeroing")
               else None if n in ("recompute (forward again)", "pipeline bubble") else "gemm")
        if key:
            acc[key] += part["seconds"]
    acc["optimizer"] = p["optimizer_s"]
    return acc
part_names = ("gemm", "attention", "experts", "other", "optimizer")
part_rows = []
for line in cases:
    name, kind, config, B, T, prec, np_, sets = line.split("|")
    if np_ != "1" or not os.path.exists(f"{out}/train-{name}-1.json"):
        continue
    tr = [load(f"train-{name}-{r}.json") for r in R]
    if not all(t.get("part_seconds") for t in tr):
        continue  # runs from before the trainer reported its parts
    pl = [plan_parts(load(f"plan-grid-{name}-{r}.json")) for r in R]
    row = {"kind": "part", "case": name, "precision": prec, "parts": {}}
    for part in part_names:
        meas = [t["part_seconds"][part] for t in tr]
        pred = [p[part] for p in pl]
        row["parts"][part] = {"measured_s": meas, "predicted_s": pred}
    part_rows.append(row)
if part_rows:
    print("step parts (held-out, GEMM grid): median measured s / predicted s (pred/meas)")
    print(f"{'case':<16}" + "".join(f"{p:>22}" for p in part_names))
    for row in part_rows:
        cells = []
        for part in part_names:
            m, pr = st.median(row["parts"][part]["measured_s"]), st.median(row["parts"][part]["predicted_s"])
            cells.append(f"{m:.3f}/{pr:.3f} ({pr / m:.2f})" if m > 1e-4 else "-")
        print(f"{row['case']:<16}" + "".join(f"{c:>22}" for c in cells))
    print()
# Held out: the sizes between the 2x grid (odd steps of the sqrt(2) sweep)
# and the largest. In sample: the 2x grid and the profile's refined sizes.
sweep, b = [], 256 * 1024.0
while b <= 128 * 2**20 * (1 + 1e-9):
    sweep.append(int(b) // 4 * 4)
    b *= 1.41421356
held_out = {x for i, x in enumerate(sweep) if i % 2 == 1 or i == len(sweep) - 1}
grid_sizes = {x for i, x in enumerate(sweep) if x not in held_out}
# Two profiles predict each round's measurement: the round's profile (its own
# bench comm run, earlier: in-sample sizes show the run-to-run spread) and the
# measurement's own run keeping only the profile's sizes (interpolation alone).
# A refined size exists only in the rounds whose profile refined there.
steps_only = not os.path.exists(f"{out}/comm-1.json")
print(f"{'collective':<16}{'algo':>6}{'bytes':>11}{'sample':>10}{'measured us':>13}"
      f"{'other run':>11}{'pred/meas':>11}{'same run':>10}{'pred/meas':>11}")
for op in () if steps_only else ("allreduce", "reduce_scatter", "allgather"):
    for algo in ("shm", "ring"):
        pred = {b: {r: {p["bytes"]: p["predicted_us"] for p in load(f"pcomm-{b}-{op}-{algo}-{r}.json")}
                    for r in R} for b in ("grid", "same")}
        meas_by = {r: {p["bytes"]: p["p50_us"] for p in load(f"comm-{r}.json")["points"]
                       if p["op"] == op and p["algo"] == algo} for r in R}
        for size in sorted(set().union(*(pred["grid"][r] for r in R))):
            rr = [r for r in R if size in meas_by[r] and size in pred["grid"][r]]
            meas = [meas_by[r][size] for r in rr]
            sample = "held-out" if size in held_out else "in"
            refined = sample == "in" and size not in grid_sizes
            ratio = {b: st.median(pred[b][r][size] / meas_by[r][size] for r in rr) for b in pred}
            label = "refined" if refined else sample
            print(f"{op:<16}{algo:>6}{size:>11}{label:>10}{st.median(meas):>13.1f}"
                  f"{st.median(pred['grid'][r][size] for r in rr):>11.1f}{ratio['grid']:>11.2f}"
                  f"{st.median(pred['same'][r][size] for r in rr):>10.1f}{ratio['same']:>11.2f}")
            for b, label in (("grid", "collective"), ("same", "collective (same run)")):
                if b == "same" and sample == "in":
                    continue  # its own measurement: equal by construction
                rows.append({"kind": label, "sample": sample, "refined": refined, "op": op,
                             "algo": algo, "bytes": size, "ranks": 2, "rounds": rr,
                             "measured_us": meas, "predicted_us": [pred[b][r][size] for r in rr],
                             "ratio": ratio[b]})
print()
summary = {}
for kind, bound in (("step", 0.15), ("collective", 0.20), ("collective (same run)", 0.20)):
    for sample in ("in", "held-out"):
        sel = [x for x in rows if x["kind"] == kind and x["sample"] == sample]
        errs = sorted(abs(x["ratio"] - 1) for x in sel)
        within = sum(1 for e in errs if e <= bound)
        summary[f"{kind}/{sample}"] = {"n": len(sel), "within": within, "bound": bound,
                                       "median_abs_error": st.median(errs) if errs else None,
                                       "max_abs_error": max(errs) if errs else None}
        if errs:
            print(f"{kind:<22}{sample:>9}: {within}/{len(sel)} within {bound:.0%}, "
                  f"median |error| {st.median(errs):.1%}, max {max(errs):.1%}")
json.dump({"rounds": rounds, "summary": summary, "rows": rows, "parts": part_rows},
          open(result + ".tmp", "w"), indent=2)
PY
mv "$result.tmp" "$result"
