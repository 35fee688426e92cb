#!/usr/bin/env bash
# The trainer's MFU against `anvil bench gemm` run in the same minute: each
# round measures the 2048^3 fp32 GEMM with bench gemm (median call, 1 s),
# then trains gpt2-124m (B=4, T=256, 6 steps) with the peak it measures and
# caches itself (the cache is emptied first, so every round measures), and
# prints the trainer's MFU beside the MFU its tokens/s give against the
# bench gemm rate, and their ratio.
# Usage: bench/mfu_vs_gemm.sh [ROUNDS (default 3)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: expected a positive integer, got '$rounds'" >&2; exit 2; }
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export ANVIL_CACHE_DIR=$out/cache
for r in $(seq 1 "$rounds"); do
  rm -rf "$ANVIL_CACHE_DIR"
  "$anvil" bench gemm --sizes 2048 --dtype fp32 --threads 2 --baselines none --min-time 1 \
    --json > "$out/gemm-$r.json"
  "$anvil" train --config configs/gpt2-124m.json -B 4 -T 256 --steps 6 \
    --json-out "$out/train-$r.json" > /dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'round':>5} {'bench gemm GFLOP/s':>19} {'trainer peak':>13} {'trainer MFU':>12} {'MFU vs bench':>13} {'ratio':>7}")
for r in range(1, rounds + 1):
    gemm = json.load(open(f"{out}/gemm-{r}.json"))["rows"][0]["gflops"]
    t = json.load(open(f"{out}/train-{r}.json"))
    mfu_bench = t["tokens_per_second"] * t["flops_per_token"] / (gemm * 1e9)
    print(f"{r:5d} {gemm:19.1f} {t['peak_gflops']:13.1f} {100 * t['mfu']:11.1f}% {100 * mfu_bench:12.1f}% "
          f"{t['mfu'] / mfu_bench:7.3f}")
PY
