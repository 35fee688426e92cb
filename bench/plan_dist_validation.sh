#!/usr/bin/env bash
# `anvil plan --dp N [--zero] [--ep K]` against distributed training on this
# machine. Each round measures the profile (anvil hw --profile), the GEMM
# shapes of one rank's micro-batch (anvil bench gemm --preset model, at all
# cores) and the 2-rank collectives (anvil bench comm --profile), then trains
# each case under mpirun (2 ranks x cores/2 threads) and asks anvil plan to
# predict it from that round's profile: the step from the per-rank share of
# the CPU, the measured collectives and the overlap model; memory per rank
# against every rank's peak RSS. Rounds interleave; medians over rounds.
# With MULTIHOST=RATE (root, iproute2) a last part runs zaya-small on two
# network-namespace hosts over a tbf link of RATE (e.g. 1gbit) and predicts
# it with --nodes 2 --link-gbps.
# Usage: bench/plan_dist_validation.sh [ROUNDS=3] [STEPS=6]
# Writes bench/results/plan_dist_validation.json.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-6}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
threads=$((cores / 2)); [ "$threads" -ge 1 ] || threads=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# name:config:B:T:train flags (per rank B; 2 ranks)
cases="gpt2-dp2:gpt2-124m:4:64:
gpt2-dp2-zero:gpt2-124m:4:64:--zero
zaya-dp2:zaya-small:4:256:--ep 1
zaya-dp2-ep2:zaya-small:4:256:--ep 2
zaya-dp2-zero-muon:zaya-small:4:256:--zero --optimizer muon"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: profile" >&2
  p="$out/local-$r.json"
  "$anvil" hw --profile "$p" --min-time 0.1 > /dev/null
  "$anvil" bench gemm --preset model --config configs/gpt2-124m.json --tokens 256 --backward \
    --dtype f32 --baselines none --min-time 0.05 --profile "$p" > /dev/null
  "$anvil" bench gemm --preset model --config configs/zaya-small.json --tokens 1024 --backward \
    --dtype f32 --baselines none --min-time 0.05 --profile "$p" > /dev/null
  "$anvil" bench comm --np 2 --op allreduce reduce_scatter allgather alltoall --algo shm ring \
    -b 64K -e 64M -f 4 -n 10 --profile "$p" > /dev/null
  while IFS=: read -r name config B T flags; do
    echo "round $r/$rounds: $name" >&2
    OMP_NUM_THREADS=$threads mpirun --oversubscribe -np 2 "$anvil" train \
      --config "configs/$config.json" -B "$B" -T "$T" --steps "$steps" --peak-gflops 100 \
      --log-every 1000 $flags --json-out "$out/train-$name-$r.json" < /dev/null > /dev/null
    pflags=$(echo "$flags" | sed 's/--ep 1//')
    "$anvil" plan --hw "$p" --config "configs/$config.json" --micro-batch "$B" --seq "$T" \
      --dtype f32 --dp 2 $pflags --json > "$out/plan-$name-$r.json"
  done <<< "$cases"
done
multihost=${MULTIHOST:-}
if [ -n "$multihost" ]; then
  echo "multi-host: zaya-small over a $multihost tbf link" >&2
  gbps=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)(g|m)bit','$multihost'); \
print(float(m[1]) / (1 if m[2]=='g' else 1000))")
  ANVIL_MULTIHOST_OUT="$out/mh" tests/parallel/multihost.sh "$anvil" . "$multihost" 20 \
    configs/zaya-small.json 2 128 < /dev/null > "$out/multihost.txt"
  "$anvil" plan --hw "$out/local-$rounds.json" --config configs/zaya-small.json --micro-batch 2 \
    --seq 128 --dtype f32 --nodes 2 --gpus-per-node 1 --threads-per-rank "$threads" \
    --link-gbps "$gbps" --json > "$out/plan-multihost.json"
  "$anvil" plan --hw "$out/local-$rounds.json" --config configs/zaya-small.json --micro-batch 2 \
    --seq 128 --dtype f32 --dp 2 --json > "$out/plan-onehost.json"
fi
mkdir -p bench/results
python3 - "$out" "$rounds" "$cases" "$multihost" <<'PY'
import json, os, statistics as st, sys
out, rounds, cases, mh = sys.argv[1], int(sys.argv[2]), sys.argv[3].splitlines(), sys.argv[4]
R = range(1, rounds + 1)
load = lambda f: json.load(open(f"{out}/{f}"))
rows = []
print(f"anvil plan vs distributed training on this machine, 2 ranks; medians over {rounds} rounds")
print(f"{'case':<20}{'B x T':>9}{'measured s':>12}{'predicted':>11}{'pred/meas':>11}"
      f"{'comm s':>9}{'exposed':>9}{'pred exp':>10}{'max RSS GB':>12}{'predicted':>11}{'pred/RSS':>10}")
for line in cases:
    name, config, B, T, flags = line.split(":")
    tr = [load(f"train-{name}-{r}.json") for r in R]
    pl = [load(f"plan-{name}-{r}.json") for r in R]
    meas = [st.median(t["step_seconds"][1:]) for t in tr]
    pred = [p["step_s"] for p in pl]
    rss = [max(t["rank_peak_rss_bytes"]) for t in tr]
    mem = [p["memory_bytes"]["total"] for p in pl]
    ratio = st.median(p / m for p, m in zip(pred, meas))
    mratio = st.median(p / m for p, m in zip(mem, rss))
    print(f"{name:<20}{B + 'x' + T:>9}{st.median(meas):>12.3f}{st.median(pred):>11.3f}{ratio:>11.2f}"
          f"{st.median(t['comm_seconds'] for t in tr):>9.3f}{st.median(t['comm_exposed_seconds'] for t in tr):>9.3f}"
          f"{st.median(p['comm_exposed_s'] for p in pl):>10.3f}"
          f"{st.median(rss) / 1e9:>12.3f}{st.median(mem) / 1e9:>11.3f}{mratio:>10.2f}")
    rows.append({"case": name, "config": config, "micro_batch": int(B), "seq": int(T), "flags": flags,
                 "measured_s": meas, "predicted_s": pred, "ratio": ratio,
                 "max_rank_peak_rss_bytes": rss, "predicted_memory_bytes": mem, "memory_ratio": mratio,
                 "optimizer_bytes": [t["optimizer_bytes"] for t in tr],
                 "predicted_optimizer_bytes": [p["memory_bytes"]["optimizer"] for p in pl]})
if mh:
    two, one = load("mh/two-hosts.json"), load("mh/one-host.json")
    p2, p1 = load("plan-multihost.json"), load("plan-onehost.json")
    print()
    print(open(f"{out}/multihost.txt").read().rstrip())
    for label, t, p in (("one host, 2 ranks", one, p1), (f"2 hosts, {mh} link", two, p2)):
        m = st.median(t["step_seconds"][1:])
        print(f"{label:<24} measured {m:.3f} s/step, predicted {p['step_s']:.3f} ({p['step_s'] / m:.2f}); "
              f"all-reduce measured {t['comm_seconds']:.3f} s, predicted {p['comm_s']:.3f} s")
        rows.append({"case": "multihost " + label, "measured_s": m, "predicted_s": p["step_s"],
                     "ratio": p["step_s"] / m, "comm_measured_s": t["comm_seconds"],
                     "comm_predicted_s": p["comm_s"]})
json.dump({"rounds": rounds, "rows": rows}, open("bench/results/plan_dist_validation.json.tmp", "w"), indent=2)
PY
mv bench/results/plan_dist_validation.json.tmp bench/results/plan_dist_validation.json
