#!/usr/bin/env bash
# `anvil plan` against measurement on this machine, side by side.
# Each round measures this machine's profile (anvil hw --profile), the
# presets' GEMM shapes into it (anvil bench gemm --preset model --profile),
# the collectives into it (anvil bench comm --profile, 2 ranks), then measures
# again: the collectives (a second anvil bench comm) and a training step of
# each preset (anvil train), and asks anvil plan / anvil plan comm to predict
# them from that round's profile. Rounds interleave, so machine drift hits
# prediction and measurement alike. Prints medians of predicted / measured
# and writes bench/results/plan_validation.json.
# Usage: bench/plan_validation.sh [ROUNDS (default 3)] [STEPS (default 6)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-6}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# preset:micro-batch:precision (sequence 256 throughout)
presets="gpt2-124m:4:fp32 llama-style:4:fp32 byte-small:16:fp32 gpt2-124m:4:bf16 zaya-small:8:fp32"
comm_flags="--op allreduce reduce_scatter allgather --algo shm ring -b 256K -e 64M -f 4 -n 10"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: profile" >&2
  "$anvil" hw --profile "$out/local-$r.json" --min-time 0.1 > /dev/null
  # The presets' own GEMM shapes (forward, dgrad, wgrad) into the profile.
  for spec in $presets; do
    IFS=: read -r name B prec <<< "$spec"
    dtype=f32; [ "$prec" = bf16 ] && dtype=bf16
    "$anvil" bench gemm --preset model --config "configs/$name.json" --tokens $((B * 256)) \
      --backward --dtype "$dtype" --baselines none --min-time 0.05 \
      --profile "$out/local-$r.json" > /dev/null
  done
  "$anvil" bench comm --np 2 $comm_flags --profile "$out/local-$r.json" > /dev/null
  echo "round $r/$rounds: collectives" >&2
  "$anvil" bench comm --np 2 $comm_flags --json > "$out/comm-$r.json"
  for spec in $presets; do
    IFS=: read -r name B prec <<< "$spec"
    echo "round $r/$rounds: train $name B=$B $prec ($steps steps)" >&2
    "$anvil" train --config "configs/$name.json" -B "$B" -T 256 --steps "$steps" \
      --precision "$prec" --json-out "$out/train-$name-$prec-$r.json" > /dev/null
    dtype=f32; [ "$prec" = bf16 ] && dtype=bf16
    "$anvil" plan --hw "$out/local-$r.json" --config "configs/$name.json" --micro-batch "$B" \
      --seq 256 --dtype "$dtype" --json > "$out/plan-$name-$prec-$r.json"
  done
  for op in allreduce reduce_scatter allgather; do
    for algo in shm ring; do
      "$anvil" plan comm --hw "$out/local-$r.json" --op "$op" --algo "$algo" --ranks 2 \
        --sizes 256K,1M,4M,16M,64M --json > "$out/pcomm-$op-$algo-$r.json"
    done
  done
done
mkdir -p bench/results
/usr/bin/python3 - "$out" "$rounds" "$presets" <<'PY'
import json, statistics as st, sys
out, rounds, presets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
R = range(1, rounds + 1)
rows = []
print(f"anvil plan vs measured on this machine; medians over {rounds} rounds (profile re-measured each round)")
print(f"{'preset':<14}{'B x T':>8}{'prec':>6}{'measured s/step':>17}{'predicted':>11}{'pred/meas':>11}"
      f"{'peak RSS GB':>13}{'predicted':>11}{'pred/RSS':>10}")
for spec in presets:
    name, B, prec = spec.split(":")
    meas = [st.median(json.load(open(f"{out}/train-{name}-{prec}-{r}.json"))["step_seconds"][1:]) for r in R]
    pred = [json.load(open(f"{out}/plan-{name}-{prec}-{r}.json"))["step_s"] for r in R]
    ratio = st.median(p / m for p, m in zip(pred, meas))
    rss = st.median(json.load(open(f"{out}/train-{name}-{prec}-{r}.json"))["peak_rss_bytes"] for r in R)
    mem = st.median(json.load(open(f"{out}/plan-{name}-{prec}-{r}.json"))["memory_bytes"]["total"] for r in R)
    print(f"{name:<14}{B + ' x 256':>8}{prec:>6}{st.median(meas):>17.3f}{st.median(pred):>11.3f}{ratio:>11.2f}"
          f"{rss / 1e9:>13.3f}{mem / 1e9:>11.3f}{mem / rss:>10.2f}")
    rows.append({"kind": "step", "preset": name, "micro_batch": int(B), "seq": 256, "precision": prec,
                 "measured_s": meas, "predicted_s": pred, "ratio": ratio,
                 "peak_rss_bytes": rss, "predicted_memory_bytes": mem})
print()
print(f"{'collective':<16}{'algo':>6}{'bytes':>10}{'measured us':>13}{'predicted':>11}{'pred/meas':>11}")
for op in ("allreduce", "reduce_scatter", "allgather"):
    for algo in ("shm", "ring"):
        pred = {r: {p["bytes"]: p["predicted_us"] for p in json.load(open(f"{out}/pcomm-{op}-{algo}-{r}.json"))} for r in R}
        for size in sorted(pred[1]):
            meas = []
            for r in R:
                pts = [p for p in json.load(open(f"{out}/comm-{r}.json"))["points"]
                       if p["op"] == op and p["algo"] == algo and p["bytes"] == size]
                meas.append(pts[0]["p50_us"] if pts else float("nan"))
            ratio = st.median(pred[r][size] / m for r, m in zip(R, meas))
            print(f"{op:<16}{algo:>6}{size:>10}{st.median(meas):>13.1f}{st.median(pred[r][size] for r in R):>11.1f}{ratio:>11.2f}")
            rows.append({"kind": "collective", "op": op, "algo": algo, "bytes": size, "ranks": 2,
                         "measured_us": meas, "predicted_us": [pred[r][size] for r in R], "ratio": ratio})
within = sum(1 for x in rows if abs(x["ratio"] - 1) <= 0.25)  # step times and collective times
print(f"\n{within}/{len(rows)} predictions within 25% of the measurement")
json.dump({"rounds": rounds, "rows": rows}, open("bench/results/plan_validation.json.tmp", "w"), indent=2)
PY
mv bench/results/plan_validation.json.tmp bench/results/plan_validation.json
