#!/usr/bin/env bash
# Training throughput of anvil vs PyTorch (Debian python3-torch) on gpt2-124m,
# B=4, T=64 and T=256, 2 threads, the same OpenBLAS core type for both,
# interleaved run by run. Prints a table and writes bench/results/train_throughput.json.
# PyTorch also runs once per shape with OPENBLAS_CORETYPE=Prescott: the kernels
# Debian's OpenBLAS falls back to on CPUs it does not know (the Intel model 207
# of docs/architecture.md, where PyTorch ran at ~23 tokens/s); 0 skips it.
# Usage: bench/train_throughput.sh [RUNS (default 3)] [ANVIL_STEPS (default 8)] [TORCH_STEPS (default 3)] [PRESCOTT_RUNS (default 1)]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
anvil_steps=${2:-8}
torch_steps=${3:-3}
prescott_runs=${4:-1}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
python=/usr/bin/python3
"$python" -c "import torch" 2>/dev/null || { echo "python3-torch is missing: run scripts/install-deps.sh" >&2; exit 1; }
export OMP_NUM_THREADS=2
# The core type anvil picks from CPUID; PyTorch's OpenBLAS gets the same.
coretype=$("$anvil" hw --json | "$python" -c "import json,sys; print(json.load(sys.stdin)['blas']['corename'])")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for T in 64 256; do
  for r in $(seq 1 "$runs"); do
    for p in fp32 bf16; do
      echo "T=$T run $r/$runs: anvil $p ($anvil_steps steps)" >&2
      "$anvil" train --config configs/gpt2-124m.json -B 4 -T "$T" --steps "$anvil_steps" \
        --precision $p --json-out "$out/anvil-$p-$T-$r.json" > /dev/null
    done
    echo "T=$T run $r/$runs: pytorch ($torch_steps steps, OPENBLAS_CORETYPE=$coretype)" >&2
    OPENBLAS_CORETYPE=$coretype "$python" bench/torch_train_gpt2.py -B 4 -T "$T" \
      --steps "$torch_steps" --threads 2 > "$out/torch-$T-$r.json"
  done
  for r in $(seq 1 "$prescott_runs"); do
    echo "T=$T run $r/$prescott_runs: pytorch (1 step, OPENBLAS_CORETYPE=Prescott)" >&2
    OPENBLAS_CORETYPE=Prescott "$python" bench/torch_train_gpt2.py -B 4 -T "$T" \
      --steps 1 --threads 2 > "$out/prescott-$T-$r.json"
  done
done
mkdir -p bench/results
"$python" - "$out" "$runs" "$coretype" <<'PY'
import json, statistics, sys, os
out, runs, coretype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
print(f"gpt2-124m, B=4, 2 threads, OpenBLAS core type {coretype}; medians of {runs} runs")
print(f"{'T':>4} {'precision':>9} {'anvil tok/s':>12} {'MFU':>6} {'torch tok/s':>12} {'anvil/torch':>12} {'torch-Prescott tok/s':>21} {'anvil/torch-Prescott':>21} {'anvil/llm.c*':>13} {'RSS/plan':>9}")
llmc = {64: 41.0}  # llm.c train_gpt2.c, B=4 T=64, 2 threads, a figure from this machine type (not in this run)
for T in (64, 256):
    t = [json.load(open(f"{out}/torch-{T}-{r}.json")) for r in range(1, runs + 1)]
    ttps = statistics.median(x["tokens_per_second"] for x in t)
    pres = [json.load(open(f"{out}/{n}")) for n in sorted(os.listdir(out))
            if n.startswith(f"prescott-{T}-")]
    ptps = statistics.median(x["tokens_per_second"] for x in pres) if pres else float("nan")
    for p in ("fp32", "bf16"):
        a = [json.load(open(f"{out}/anvil-{p}-{T}-{r}.json")) for r in range(1, runs + 1)]
        atps = statistics.median(x["tokens_per_second"] for x in a)
        amfu = statistics.median(x["mfu"] for x in a)
        peak = statistics.median(x["peak_gflops"] for x in a)
        rss = statistics.median(x["peak_rss_bytes"] / x["planned_bytes"] for x in a)
        ratio_llmc = f"{atps / llmc[T]:.1f}x" if T in llmc else "-"
        print(f"{T:>4} {p:>9} {atps:>12.1f} {100*amfu:>5.1f}% {ttps:>12.1f} {atps/ttps:>11.1f}x "
              f"{ptps:>21.1f} {atps/ptps:>20.1f}x {ratio_llmc:>13} {rss:>9.3f}")
        rows.append({"T": T, "precision": p, "anvil_tokens_per_s": atps, "anvil_mfu": amfu,
                     "peak_gflops": peak, "torch_tokens_per_s": ttps, "ratio": atps / ttps,
                     "torch_prescott_tokens_per_s": ptps,
                     "anvil_runs": [x["tokens_per_second"] for x in a],
                     "torch_runs": [x["tokens_per_second"] for x in t],
                     "torch_prescott_runs": [x["tokens_per_second"] for x in pres],
                     "peak_rss_over_plan": rss, "planned_bytes": a[0]["planned_bytes"]})
print("* llm.c is not in Debian and cannot be fetched here: its 41 tok/s (B=4, T=64) was measured")
print("  outside this script on a Zen 5 VM of this type (2026-11-29): a carried figure, not a same-run baseline.")
print("MFU: model FLOPs (6 per weight + attention) per second over the 2048^3 GEMM peak anvil measured")
print("at start in the same precision (fp32 sgemm; bf16-input GEMM for bf16). torch runs fp32.")
json.dump({"coretype": coretype, "runs": runs, "rows": rows}, open("bench/results/train_throughput.json", "w"), indent=2)
PY
