#!/usr/bin/env bash
# Training throughput of two anvil builds, interleaved run by run: gpt2-124m
# (B=4, T=256) and zaya-small (B=8, T=256), fp32 (PRECISION=bf16 for bf16),
# random tokens, 2 threads.
# Each run's tokens/s is the trainer's median step after the first; the
# table gives each build's median over the rounds and their ratio (this
# build / OTHER). Writes bench/results/compare_builds.json
# (compare_builds-bf16.json for bf16).
# Usage: [PRECISION=fp32|bf16] bench/compare_builds.sh OTHER_ANVIL [ROUNDS (default 3)] [STEPS (default 8)]
set -euo pipefail
cd "$(dirname "$0")/.."
other=${1:?usage: bench/compare_builds.sh OTHER_ANVIL [ROUNDS] [STEPS]}
rounds=${2:-3}
steps=${3:-8}
[ -x "$other" ] || { echo "OTHER_ANVIL: $other is not an executable" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: expected a positive integer, got '$rounds'" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "STEPS: expected a positive integer, got '$steps'" >&2; exit 2; }
precision=${PRECISION:-fp32}
[[ "$precision" =~ ^(fp32|bf16)$ ]] || { echo "PRECISION: expected fp32 or bf16, got '$precision'" >&2; exit 2; }
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A args=([gpt2-124m]="-B 4 -T 256" [zaya-small]="-B 8 -T 256")
for r in $(seq 1 "$rounds"); do
  for model in gpt2-124m zaya-small; do
    for build in this other; do
      bin=$anvil
      [ "$build" = other ] && bin=$other
      echo "round $r/$rounds: $model, $build build" >&2
      # shellcheck disable=SC2086
      "$bin" train --config "configs/$model.json" ${args[$model]} --steps "$steps" \
        --precision "$precision" --peak-gflops 100 --json-out "$out/$model-$build-$r.json" > /dev/null
    done
  done
done
mkdir -p bench/results
python3 - "$out" "$rounds" "$other" "$precision" <<'PY'
import json, statistics as st, sys
out, rounds, other, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {}
print(f"{'model':12} {'this tok/s':>11} {'other tok/s':>12} {'ratio':>7}  per round (this/other)")
for model in ("gpt2-124m", "zaya-small"):
    tps = {b: [json.load(open(f"{out}/{model}-{b}-{r}.json"))["tokens_per_second"]
               for r in range(1, rounds + 1)] for b in ("this", "other")}
    med = {b: st.median(v) for b, v in tps.items()}
    pairs = [t / o for t, o in zip(tps["this"], tps["other"])]
    rows[model] = {"this": tps["this"], "other": tps["other"], "median_this": med["this"],
                   "median_other": med["other"], "ratio": med["this"] / med["other"],
                   "pairwise": pairs}
    print(f"{model:12} {med['this']:11.1f} {med['other']:12.1f} {med['this'] / med['other']:7.3f}  "
          + " ".join(f"{p:.3f}" for p in pairs))
json.dump({"other": other, "rounds": rounds, "precision": precision, "models": rows}, open("bench/results/compare_builds.json" if precision == "fp32" else f"bench/results/compare_builds-{precision}.json", "w"), indent=1)
PY
