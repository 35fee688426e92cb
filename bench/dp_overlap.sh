#!/usr/bin/env bash
# Data-parallel overlap on this machine: the same global batch trained by
# 1 rank x all cores and by N ranks x (cores / N) threads (mpirun), runs
# interleaved, medians of REPEATS. Prints tokens/s of each, their ratio, and
# the data-parallel run's all-reduce time per step next to the part of it
# backward did not hide (exposed).
# Usage: bench/dp_overlap.sh [REPEATS=3] [STEPS=6] [CONFIG=configs/gpt2-124m.json] [GLOBAL_B=8] [T=64] [RANKS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}; steps=${2:-6}; config=${3:-configs/gpt2-124m.json}; gb=${4:-8}; T=${5:-64}; ranks=${6:-2}
cores=$(nproc)
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(train --config "$config" -T "$T" --steps "$steps" --peak-gflops 100 --log-every 1000)
for i in $(seq 1 "$repeats"); do
  OMP_NUM_THREADS=$cores build/anvil "${common[@]}" -B "$gb" --json-out "$out/one-$i.json" >/dev/null
  OMP_NUM_THREADS=$((cores / ranks)) mpirun --oversubscribe -np "$ranks" build/anvil "${common[@]}" \
    -B $((gb / ranks)) --json-out "$out/dp-$i.json" >/dev/null
  echo "repeat $i done" >&2
done
python3 - "$out" "$repeats" "$ranks" "$cores" "$config" "$gb" "$T" <<'PY'
import json, statistics, sys
out, repeats, ranks, cores, config, gb, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
one = [json.load(open(f"{out}/one-{i}.json")) for i in range(1, repeats + 1)]
dp = [json.load(open(f"{out}/dp-{i}.json")) for i in range(1, repeats + 1)]
med = lambda runs, k: statistics.median(r[k] for r in runs)
a, b = med(one, "tokens_per_second"), med(dp, "tokens_per_second")
print(f"{config}, global batch {gb}x{T}, medians of {repeats} interleaved runs")
print(f"1 rank x {cores} threads: {a:8.1f} tok/s")
print(f"{ranks} ranks x {cores // ranks} thread(s): {b:8.1f} tok/s   ratio {b / a:.3f}")
print(f"all-reduce per step {1e3 * med(dp, 'comm_seconds'):.1f} ms, exposed {1e3 * med(dp, 'comm_exposed_seconds'):.1f} ms "
      f"(step {1e3 * int(gb) * int(T) / b:.0f} ms)")
PY
rm -rf "$out"
