#!/usr/bin/env bash
# `anvil bench membw` triad against the STREAM-method reference (bench/stream_ref.c,
# built -O3 -march=native -fopenmp) at the same array size and thread counts,
# RUNS times each (default 3); prints medians and the ratio.
# Usage: bench/membw_vs_stream.sh [RUNS] [ELEMENTS_PER_ARRAY]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
n=${2:-20000000}
ws=$((n * 8 * 3))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in $(seq "$(nproc)"); do
  for i in $(seq "$runs"); do
    OMP_NUM_THREADS=$t build/stream_ref "$n" 10 | tail -1 > "$tmp/stream-$t-$i.json"
    build/anvil bench membw --kernels copy,triad --sizes "$ws" --threads "$t" --min-time 0.5 --json > "$tmp/anvil-$t-$i.json"
  done
done
python3 - "$tmp" "$runs" "$ws" <<'PY'
import json, statistics, sys, glob, os
d, runs, ws = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
threads = sorted({int(os.path.basename(f).split("-")[1]) for f in glob.glob(d + "/stream-*.json")})
print(f"working set {ws / 2**20:.0f} MiB (3 arrays), best-of-passes GB/s, median of {runs} runs")
for t in threads:
    for k in ("copy", "triad"):
        s = statistics.median(json.load(open(f))[k + "_gbs"] for f in glob.glob(f"{d}/stream-{t}-*.json"))
        a = statistics.median(next(r for r in json.load(open(f))["rows"] if r["kernel"] == k)["gbs"]
                              for f in glob.glob(f"{d}/anvil-{t}-*.json"))
        print(f"threads={t} {k:5s}: anvil {a:6.2f} GB/s | stream_ref {s:6.2f} GB/s | anvil/stream = {a / s:.3f}")
PY
