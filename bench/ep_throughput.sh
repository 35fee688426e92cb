#!/usr/bin/env bash
# Expert parallelism on this machine: zaya-small on RANKS ranks (mpirun), the
# same global batch with --ep 1 (every rank runs all experts) and --ep RANKS
# (each rank runs E/RANKS experts; tokens dispatched by all-to-all), runs
# interleaved, medians of REPEATS. Prints tokens/s of each, their ratio, and
# the all-to-all time per step with its share of the step.
# Usage: bench/ep_throughput.sh [REPEATS=3] [STEPS=6] [CONFIG=configs/zaya-small.json] [B=4] [T=256] [RANKS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}; steps=${2:-6}; config=${3:-configs/zaya-small.json}; B=${4:-4}; T=${5:-256}; ranks=${6:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
threads=$(( $(nproc) / ranks )); [ "$threads" -ge 1 ] || threads=1
for i in $(seq 1 "$repeats"); do
  for ep in 1 "$ranks"; do
    OMP_NUM_THREADS=$threads mpirun --oversubscribe -np "$ranks" build/anvil train --config "$config" \
      -B "$B" -T "$T" --steps "$steps" --peak-gflops 100 --log-every 1000 --ep "$ep" \
      --json-out "$out/ep$ep-$i.json" >/dev/null
  done
  echo "repeat $i done" >&2
done
python3 - "$out" "$repeats" "$ranks" "$config" "$B" "$T" <<'PY'
import json, statistics, sys
out, repeats, ranks, config, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
runs = {ep: [json.load(open(f"{out}/ep{ep}-{i}.json")) for i in range(1, repeats + 1)] for ep in (1, ranks)}
med = lambda ep, k: statistics.median(r[k] for r in runs[ep])
a, b = med(1, "tokens_per_second"), med(ranks, "tokens_per_second")
step = B * ranks * T / b
print(f"{config}, {ranks} ranks x {B}x{T} rows, medians of {repeats} interleaved runs")
print(f"--ep 1:      {a:8.1f} tok/s")
print(f"--ep {ranks}:      {b:8.1f} tok/s   ratio {b / a:.3f}")
print(f"all-to-all {1e3 * med(ranks, 'alltoall_seconds'):.1f} ms per {1e3 * step:.0f} ms step "
      f"({100 * med(ranks, 'alltoall_seconds') / step:.1f}%); gradient all-reduce {1e3 * med(ranks, 'comm_seconds'):.1f} ms, "
      f"exposed {1e3 * med(ranks, 'comm_exposed_seconds'):.1f} ms")
PY
