#!/usr/bin/env bash
# The 2-rank collective check: shm against MPI's own collective
# for all-reduce, reduce-scatter and all-gather from 8 B to 256 MiB, RUNS times
# (default 3); prints the median busbw of each and the ratio.
# Usage: [COMM_SIZES="-b 1M -e 256M -f 2"] bench/comm_acceptance.sh [RUNS] [RANKS] [EXTRA anvil flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
np=${2:-2}
shift $(( $# > 2 ? 2 : $# )) || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
  build/anvil bench comm --np "$np" --op allreduce,reduce_scatter,allgather --algo shm \
    ${COMM_SIZES:--b 8 -e 256M -f 8} -n 8 -w 2 --json "$@" > "$tmp/run$i.json"
done
python3 - "$tmp" <<'PY'
import json, statistics, sys, glob
runs = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/run*.json"))]
ranks = runs[0]["ranks"]
print(f"{ranks} ranks, busbw GB/s, median of {len(runs)} runs; #wrong summed over runs")
print(f"{'op':15s} {'bytes':>10s} {'mpi':>8s} {'shm':>8s} {'shm/mpi':>8s} {'wrong':>6s}")
keys = sorted({(p["op"], p["bytes"]) for p in runs[0]["points"]}, key=lambda k: (k[0], k[1]))
for op, b in keys:
    def med(algo):
        return statistics.median(next(p["busbw_gbs"] for p in r["points"] if p["op"] == op and p["bytes"] == b and p["algo"] == algo) for r in runs)
    wrong = sum(p["wrong"] for r in runs for p in r["points"] if p["op"] == op and p["bytes"] == b)
    m, s = med("mpi"), med("shm")
    print(f"{op:15s} {b:10d} {m:8.2f} {s:8.2f} {s / m if m else float('nan'):8.2f} {wrong:6d}")
PY
