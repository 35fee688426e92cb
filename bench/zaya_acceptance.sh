#!/usr/bin/env bash
# ZAYA1 (issue 5) measurements on zaya-small, B=8, T=256:
#  1. throughput: 16 experts + skip vs the same model with one expert (the
#     same active parameters, CCA attention and router: the dense-width
#     equivalent), interleaved, random tokens, medians of RUNS;
#  2. training on KJV for STEPS steps: AdamW vs Muon (same tokens), and the
#     balancing variants (pid, none, pid + Switch aux loss, aux loss alone);
#     loads summarised by bench/zaya_balance.py.
# Usage: bench/zaya_acceptance.sh [RUNS (default 3)] [STEPS (default 120)]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
steps=${2:-120}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
[ -f data/kjv.txt ] || scripts/kjv-text.sh
export OMP_NUM_THREADS=2
out=runs/zaya-acceptance
mkdir -p "$out"
common="--config configs/zaya-small.json -B 8 -T 256"
for r in $(seq 1 "$runs"); do
  for e in 16 1; do
    echo "throughput run $r/$runs: $e expert(s)" >&2
    "$anvil" train $common --set n_experts=$e --steps 8 --json-out "$out/tput-$e-$r.json" > /dev/null
  done
done
/usr/bin/python3 - "$out" "$runs" <<'PY'
import json, statistics as st, sys
out, runs = sys.argv[1], int(sys.argv[2])
med = lambda e: st.median(json.load(open(f"{out}/tput-{e}-{r}.json"))["tokens_per_second"] for r in range(1, runs + 1))
moe, dense = med(16), med(1)
print(f"zaya-small tokens/s: 16 experts {moe:.1f}, 1 expert (same active params) {dense:.1f}, ratio {moe/dense:.3f}")
json.dump({"moe_tokens_per_s": moe, "one_expert_tokens_per_s": dense, "ratio": moe / dense},
          open(f"{out}/throughput.json", "w"), indent=2)
PY
train="$anvil train $common --data data/kjv.txt --steps $steps --lr 2e-3 --warmup 20 --val-every 40 --seed 1"
run() {  # name, flags...
  local name=$1; shift
  echo "train $name ($steps steps)" >&2
  rm -rf "$out/$name"
  $train --out "$out/$name" --ckpt-every 0 "$@" > "$out/$name.log" 2>&1
}
run adamw-pid --optimizer adamw --balancing pid
run muon-pid --optimizer muon --balancing pid
run adamw-none --optimizer adamw --balancing none
run adamw-pid-aux --optimizer adamw --balancing pid --aux-loss-coef 1e-2
run adamw-aux --optimizer adamw --balancing none --aux-loss-coef 1e-2
/usr/bin/python3 bench/zaya_balance.py --warmup 40 --window 40 --json "$out/balance.json" \
  "$out"/adamw-pid "$out"/muon-pid "$out"/adamw-none "$out"/adamw-pid-aux "$out"/adamw-aux
