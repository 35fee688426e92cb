#!/usr/bin/env bash
# Context parallelism on this machine: zaya-small at sequence length T, one
# row per step, cp 1 (one process, all cores) against cp 2 (two ranks, half
# the cores each, every sequence split into 4 chunks), runs interleaved,
# medians of REPEATS. Prints tokens/s of each and their ratio, the context
# traffic per step (K/V all-gathers, dK/dV reduce-scatters, CCA halos; none
# of it overlapped, so all of it exposed), and each run's peak RSS per rank
# against its memory plan. Losses of the two are printed side by side (the
# same global batch: they agree to ~1e-7).
# Then `anvil plan` predicts both from a profile this script measures first
# (anvil hw --profile, the model's GEMM shapes at each rank's tokens, the
# 2-rank collectives): step time and memory per rank against the medians.
# Usage: bench/cp_throughput.sh [REPEATS=3] [STEPS=4] [T values="4096 8192"] [OUT=json file]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}; steps=${2:-4}; seqs=${3:-"4096 8192"}; json=${4:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
profile="$out/profile.json"
echo "profile: anvil hw, GEMM shapes, 2-rank collectives" >&2
build/anvil hw --profile "$profile" --min-time 0.1 >/dev/null
for T in $seqs; do
  for tokens in "$T" $(( T / 2 )); do
    build/anvil bench gemm --preset model --config configs/zaya-small.json --tokens "$tokens" \
      --backward --dtype f32 --baselines none --min-time 0.05 --profile "$profile" >/dev/null
  done
done
build/anvil bench comm --np 2 --op allgather reduce_scatter allreduce --algo shm ring -b 64K \
  -e 64M -f 4 -n 10 --profile "$profile" >/dev/null
for T in $seqs; do
  for cp in 1 2; do
    build/anvil plan --hw "$profile" --config configs/zaya-small.json --set "seq_len=$T" \
      --micro-batch 1 --seq "$T" --dtype f32 --cp "$cp" --json > "$out/plan-cp$cp-$T.json"
  done
done
for T in $seqs; do
  for i in $(seq 1 "$repeats"); do
    common=(train --config configs/zaya-small.json --set "seq_len=$T" -B 1 -T "$T" --steps "$steps"
            --peak-gflops 100 --log-every 1000)
    OMP_NUM_THREADS=$cores build/anvil "${common[@]}" --json-out "$out/cp1-$T-$i.json" >/dev/null
    OMP_NUM_THREADS=$(( cores / 2 > 0 ? cores / 2 : 1 )) mpirun --oversubscribe -np 2 build/anvil \
      "${common[@]}" --cp 2 --json-out "$out/cp2-$T-$i.json" >/dev/null
    echo "T=$T repeat $i done" >&2
  done
done
python3 - "$out" "$repeats" "$seqs" "$json" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$cores" <<'PY'
import json, statistics, sys, datetime
out, repeats, seqs, dest, cpu, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5], int(sys.argv[6])
rows = []
print(f"zaya-small, B=1, {cpu} ({cores} cores); medians of {repeats} interleaved runs")
print(f"{'T':>6} {'cp1 tok/s':>10} {'cp2 tok/s':>10} {'ratio':>6} {'ctx ms':>7} {'step ms':>8} {'ctx %':>6} "
      f"{'cp1 RSS/plan GiB':>17} {'cp2 RSS/plan GiB':>17} {'last loss cp1 / cp2':>22}")
for T in seqs:
    runs = {cp: [json.load(open(f"{out}/cp{cp}-{T}-{i}.json")) for i in range(1, repeats + 1)] for cp in (1, 2)}
    med = lambda cp, k: statistics.median(r[k] for r in runs[cp])
    a, b = med(1, "tokens_per_second"), med(2, "tokens_per_second")
    ctx = med(2, "context_seconds")
    step = int(T) / b
    gib = lambda v: v / 2**30
    rss1, plan1 = med(1, "peak_rss_bytes"), runs[1][0]["planned_bytes"]
    rss2 = statistics.median(max(r["rank_peak_rss_bytes"]) for r in runs[2])
    plan2 = runs[2][0]["planned_bytes"]
    l1, l2 = runs[1][0]["losses"][-1], runs[2][0]["losses"][-1]
    plan = {cp: json.load(open(f"{out}/plan-cp{cp}-{T}.json")) for cp in (1, 2)}
    steps_measured = {cp: statistics.median(statistics.median(r["step_seconds"][1:]) for r in runs[cp]) for cp in (1, 2)}
    rss = {1: rss1, 2: rss2}
    print(f"{T:>6} {a:10.1f} {b:10.1f} {b / a:6.3f} {1e3 * ctx:7.1f} {1e3 * step:8.0f} {100 * ctx / step:5.1f}% "
          f"{gib(rss1):8.2f} / {gib(plan1):5.2f} {gib(rss2):8.2f} / {gib(plan2):5.2f} {l1:10.6f} / {l2:.6f}")
    rows.append({"T": int(T), "cp1_tokens_per_second": a, "cp2_tokens_per_second": b, "ratio": b / a,
                 "cp2_context_seconds_per_step": ctx, "cp2_step_seconds": step, "context_exposed_seconds": ctx,
                 "cp1_peak_rss_bytes": rss1, "cp1_planned_bytes": plan1,
                 "cp2_peak_rss_bytes_max_rank": rss2, "cp2_planned_bytes": plan2,
                 "cp1_losses": runs[1][0]["losses"], "cp2_losses": runs[2][0]["losses"],
                 "plan": {f"cp{cp}": {"predicted_step_seconds": plan[cp]["step_s"],
                                      "measured_step_seconds": steps_measured[cp],
                                      "step_ratio": plan[cp]["step_s"] / steps_measured[cp],
                                      "predicted_memory_bytes": plan[cp]["memory_bytes"]["total"],
                                      "measured_peak_rss_bytes": rss[cp],
                                      "memory_ratio": plan[cp]["memory_bytes"]["total"] / rss[cp],
                                      "predicted_comm_exposed_seconds": plan[cp]["comm_exposed_s"]}
                          for cp in (1, 2)}})
print()
print("anvil plan against the runs (profile measured above; medians of the steps after the first)")
print(f"{'T':>6} {'cp':>3} {'step s':>8} {'predicted':>10} {'ratio':>6} {'RSS GiB':>8} {'predicted':>10} {'ratio':>6} {'ctx s meas/pred':>16}")
for row in rows:
    for cp in (1, 2):
        p = row["plan"][f"cp{cp}"]
        ctx = f"{row['cp2_context_seconds_per_step']:.3f} / {p['predicted_comm_exposed_seconds']:.3f}" if cp == 2 else ""
        print(f"{row['T']:>6} {cp:>3} {p['measured_step_seconds']:8.3f} {p['predicted_step_seconds']:10.3f} {p['step_ratio']:6.2f} "
              f"{p['measured_peak_rss_bytes'] / 2**30:8.2f} {p['predicted_memory_bytes'] / 2**30:10.2f} {p['memory_ratio']:6.2f} {ctx:>16}")
if dest:
    with open(dest, "w") as f:
        json.dump({"date": datetime.date.today().isoformat(), "cpu": cpu, "cores": cores,
                   "model": "zaya-small", "batch": 1, "repeats": repeats, "rows": rows}, f, indent=1)
PY
