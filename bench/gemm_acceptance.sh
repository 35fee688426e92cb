#!/usr/bin/env bash
# The GEMM check: 2048^3 fp32 on 1 and 2 threads,
# anvil against every baseline, RUNS times (default 3); prints the median
# GFLOP/s of each and the ratios. Usage: bench/gemm_acceptance.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
  build/anvil bench gemm --sizes 2048 --threads 1,2 --min-time 1 \
    --baselines library,env,coretype:Prescott,coretype:Haswell,onednn --json > "$tmp/run$i.json"
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys, glob
runs = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/run*.json"))]
print(f"2048x2048x2048 fp32, median of {len(runs)} runs (GFLOP/s); BLAS: {runs[0]['blas']['corename']} ({runs[0]['blas']['reason']})")
for b, note in runs[0]["baselines"].items():
    print(f"  {b}: {note}")
for t in sorted({r["threads"] for r in runs[0]["rows"]}):
    anvil = statistics.median(next(r for r in run["rows"] if r["threads"] == t)["gflops"] for run in runs)
    line = f"threads={t}: anvil {anvil:.1f}"
    for b in runs[0]["rows"][0]["baselines_gflops"]:
        v = statistics.median(next(r for r in run["rows"] if r["threads"] == t)["baselines_gflops"][b] for run in runs)
        line += f" | {b} {v:.1f} (anvil/{b} = {anvil / v:.2f})"
    print(line)
PY
