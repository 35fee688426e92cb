#!/usr/bin/env bash
# zaya-small (B=8, T=256, fp32, AdamW, random tokens) throughput and MFU, and
# the 16-expert model against the same model with one expert (the same
# active parameters), interleaved run by run. Each run measures the 2048^3
# sgemm peak at start; this VM's peak moves by +-15% between runs, so the
# MFU is given both per run (its own peak) and over the median of every
# run's peak. Prints a table and writes bench/results/zaya_throughput.json.
# Usage: bench/zaya_throughput.sh [ROUNDS (default 3)] [STEPS (default 8)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-8}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: expected a positive integer, got '$rounds'" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "STEPS: expected a positive integer, got '$steps'" >&2; exit 2; }
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for e in 16 1; do
    echo "round $r/$rounds: $e expert(s), $steps steps" >&2
    "$anvil" train --config configs/zaya-small.json -B 8 -T 256 --set n_experts=$e \
      --steps "$steps" --json-out "$out/e$e-$r.json" > /dev/null
  done
done
mkdir -p bench/results
python3 - "$out" "$rounds" <<'PY'
import json, os, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {e: [json.load(open(f"{out}/e{e}-{r}.json")) for r in range(1, rounds + 1)] for e in (16, 1)}
peak = st.median(d["peak_gflops"] for e in runs for d in runs[e])
rows = {}
for e, rs in runs.items():
    tps = [d["tokens_per_second"] for d in rs]
    fpt = rs[0]["flops_per_token"]
    rows[e] = {"tokens_per_s": tps, "median_tokens_per_s": st.median(tps),
               "mfu_own_peak": [d["mfu"] for d in rs], "median_mfu_own_peak": st.median(d["mfu"] for d in rs),
               "mfu_median_peak": st.median(tps) * fpt / 1e9 / peak,
               "peak_gflops": [d["peak_gflops"] for d in rs], "flops_per_token": fpt}
ratio = rows[16]["median_tokens_per_s"] / rows[1]["median_tokens_per_s"]
pairs = [a / b for a, b in zip(rows[16]["tokens_per_s"], rows[1]["tokens_per_s"])]
print(f"zaya-small B=8 T=256 fp32 AdamW, 2 threads, medians of {rounds} interleaved rounds")
print(f"{'experts':>8} {'tok/s':>8} {'MFU (own peak)':>15} {'MFU (median peak)':>18}  per-run tok/s")
for e in (16, 1):
    r = rows[e]
    print(f"{e:>8} {r['median_tokens_per_s']:>8.1f} {100 * r['median_mfu_own_peak']:>14.1f}% "
          f"{100 * r['mfu_median_peak']:>17.1f}%  " + " ".join(f"{x:.1f}" for x in r["tokens_per_s"]))
print(f"median sgemm peak over all runs: {peak:.1f} GFLOP/s (per run: "
      + " ".join(f"{d['peak_gflops']:.1f}" for e in runs for d in runs[e]) + ")")
print(f"16 experts / 1 expert: {ratio:.3f} (ratio of medians); pairwise "
      + " ".join(f"{p:.2f}" for p in pairs))
result = {"rounds": rounds, "median_peak_gflops": peak, "ratio_16_to_1": ratio,
          "pairwise_ratios": pairs, "experts": {str(e): rows[e] for e in rows}}
tmp = "bench/results/zaya_throughput.json.tmp"
with open(tmp, "w") as f:
    json.dump(result, f, indent=2)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, "bench/results/zaya_throughput.json")
PY
