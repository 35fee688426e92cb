#!/usr/bin/env bash
# Attention forward+backward on the tile kernel against the BLAS tiles
# (ANVIL_ATTENTION_TILES=kernel / blas), interleaved run by run: each round
# runs `anvil bench attention` once per path, and each run measures its own
# 2048^3 sgemm peak. Prints the medians per shape (GFLOP/s and % of the run's
# own peak) with the pairwise speed-ups, and writes
# bench/results/attention_tiles.json. OTHER=path/to/anvil adds a third
# column: another binary's default path (e.g. one built before a change).
# ANVIL=BIN times another build (default build/anvil).
# Usage: [ANVIL=BIN] [OTHER=BIN] bench/attention_tiles.sh [ROUNDS (default 5)] [MIN_TIME (default 0.3)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
min_time=${2:-0.3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: expected a positive integer, got '$rounds'" >&2; exit 2; }
anvil=${ANVIL:-build/anvil}
[ -x "$anvil" ] || scripts/build.sh
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
paths="kernel blas"
[ -n "${OTHER:-}" ] && paths="$paths other"
for r in $(seq 1 "$rounds"); do
  for p in $paths; do
    echo "round $r/$rounds: $p" >&2
    if [ "$p" = other ]; then
      "$OTHER" bench attention --min-time "$min_time" --json > "$out/$p-$r.json"
    else
      ANVIL_ATTENTION_TILES=$p "$anvil" bench attention --min-time "$min_time" --json > "$out/$p-$r.json"
    fi
  done
done
mkdir -p bench/results
/usr/bin/python3 - "$out" "$rounds" "$paths" <<'PY'
import json, os, statistics as st, sys
out, rounds, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
runs = {p: [json.load(open(f"{out}/{p}-{r}.json")) for r in range(1, rounds + 1)] for p in paths}
shapes = [(row["seq"], row["head_dim"]) for row in runs[paths[0]][0]["rows"]]
def series(p, shape, key):
    return [next(x[key] for x in run["rows"] if (x["seq"], x["head_dim"]) == shape) for run in runs[p]]
peaks = {p: [run["sgemm_peak_gflops"] for run in runs[p]] for p in paths}
print(f"attention fwd+bwd, 2 threads, medians of {rounds} interleaved rounds "
      f"(sgemm peak medians: " + ", ".join(f"{p} {st.median(peaks[p]):.1f}" for p in paths) + " GFLOP/s)")
head = f"{'T':>5} {'D':>4}" + "".join(f" {p + ' GF/s':>12} {p + ' %':>9}" for p in paths) + "  kernel/blas (pairwise)"
print(head)
rows = []
for shape in shapes:
    g = {p: series(p, shape, "total_gflops") for p in paths}
    pct = {p: series(p, shape, "pct_of_sgemm_peak") for p in paths}
    pairs = [a / b for a, b in zip(g["kernel"], g["blas"])]
    line = f"{shape[0]:>5} {shape[1]:>4}" + "".join(
        f" {st.median(g[p]):>12.1f} {st.median(pct[p]):>8.1f}%" for p in paths)
    line += f"  {st.median(g['kernel']) / st.median(g['blas']):.2f}x (" + " ".join(f"{x:.2f}" for x in pairs) + ")"
    print(line)
    rows.append({"seq": shape[0], "head_dim": shape[1],
                 **{f"{p}_gflops": g[p] for p in paths}, **{f"{p}_pct_of_peak": pct[p] for p in paths},
                 "kernel_over_blas": st.median(g["kernel"]) / st.median(g["blas"])})
tmp = "bench/results/attention_tiles.json.tmp"
with open(tmp, "w") as f:
    json.dump({"rounds": rounds, "peaks": peaks, "rows": rows}, f, indent=2)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, "bench/results/attention_tiles.json")
PY
