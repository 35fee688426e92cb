#!/usr/bin/env bash
# Muon's cost on zaya-small (B=8, T=256, 2 threads): the step with
# --optimizer muon against the step with AdamW, interleaved, medians of
# ROUNDS. The difference is Muon's update (momentum, Newton-Schulz, weight
# update) minus AdamW's on the same matrices; dividing the Newton-Schulz
# FLOPs as full GEMMs would do them (5 iterations of 4 r^2 c + 2 r^3 per
# r x c matrix, r <= c, every muon-group matrix: the 2-D weights inside the
# blocks) by it gives a lower bound on the full-GEMM-equivalent rate, printed
# against the sgemm peak the trainer measured at start (anvil multiplies the
# symmetric X X^T and A A below the diagonal only, so this rate can pass the
# peak). OTHER=path/to/anvil times a second binary's Muon steps, fp32 and
# bf16, in the same rounds (e.g. one built before a change). Muon with
# --muon-bf16 (bf16 inputs to the Newton-Schulz GEMMs) is timed too.
# ACCUM=N accumulates N micro-batches of 8 x 256 per step (default 1): the
# optimizer's cost is per step, so its share falls as the global batch grows.
# Usage: [OTHER=BIN] [ACCUM=N] bench/muon_step.sh [ROUNDS (default 3)] [STEPS (default 4)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-4}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
export OMP_NUM_THREADS=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
accum=${ACCUM:-1}
[[ "$accum" =~ ^[1-9][0-9]*$ ]] || { echo "ACCUM: expected a positive integer, got '$accum'" >&2; exit 2; }
flags=(--config configs/zaya-small.json -B 8 -T 256 --accum "$accum" --steps "$steps" --log-every 1000)
# The muon-group shapes, from a checkpoint's index (global shapes).
"$anvil" train --config configs/zaya-small.json -B 8 -T 256 --steps 1 --out "$out/ckpt" \
  --log-every 1000 > /dev/null
for r in $(seq 1 "$rounds"); do
  for v in adamw muon muon-bf16 ${OTHER:+other other-bf16}; do
    echo "round $r/$rounds: $v" >&2
    bin=$anvil; opt=$v; extra=()
    [[ "$v" == other* ]] && { bin=$OTHER; opt=muon; }
    [[ "$v" == *-bf16 ]] && { opt=muon; extra=(--muon-bf16); }
    "$bin" train "${flags[@]}" --optimizer "$opt" "${extra[@]}" --json-out "$out/$v-$r.json" \
      < /dev/null > /dev/null
  done
done
/usr/bin/python3 - "$out" "$rounds" "$accum" <<'PY'
import glob, json, os, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
shapes = []
for f in glob.glob(f"{out}/ckpt/step-*/index.json"):
    for name, t in json.load(open(f))["tensors"].items():
        if (t["kind"] == "model" and name.startswith("model.layers.") and name.endswith(".weight")
                and len(t["shape"]) == 2):
            shapes.append(t["shape"])
ns = 0.0
for rows, cols in shapes:
    r, c = min(rows, cols), max(rows, cols)
    ns += 5 * (4 * r * r * c + 2 * r ** 3)
def med(v):
    runs = [json.load(open(f"{out}/{v}-{i}.json")) for i in range(1, rounds + 1)
            if os.path.exists(f"{out}/{v}-{i}.json")]
    return (st.median(st.median(x["step_seconds"][1:]) for x in runs),
            st.median(x["peak_gflops"] for x in runs)) if runs else (None, None)
(adam, peak), (muon, _), (muon16, _) = med("adamw"), med("muon"), med("muon-bf16")
(other, _), (other16, _) = med("other"), med("other-bf16")
accum = int(sys.argv[3])
print(f"zaya-small B=8 T=256 accum {accum} ({8 * 256 * accum} tokens per step), 2 threads; "
      f"medians of {rounds} rounds; sgemm peak {peak:.1f} GFLOP/s")
print(f"{len(shapes)} muon-group matrices, Newton-Schulz {ns / 1e9:.1f} GFLOP per step as full GEMMs")
print(f"AdamW step {adam:.3f} s, Muon step {muon:.3f} s: Muon / AdamW {muon / adam:.2f}x")
rate = ns / (muon - adam) / 1e9
print(f"Newton-Schulz at >= {rate:.1f} GFLOP/s full-GEMM-equivalent = {100 * rate / peak:.1f}% of the sgemm peak")
rate16 = ns / (muon16 - adam) / 1e9
print(f"Muon with --muon-bf16 (bf16 Newton-Schulz GEMMs): step {muon16:.3f} s, Muon / AdamW "
      f"{muon16 / adam:.2f}x; Newton-Schulz at >= {rate16:.1f} GFLOP/s full-GEMM-equivalent = "
      f"{100 * rate16 / peak:.1f}% of the fp32 sgemm peak")
if other:
    print(f"OTHER binary's Muon step {other:.3f} s (this build {other / muon:.2f}x faster); "
          f"its Newton-Schulz >= {ns / (other - adam) / 1e9:.1f} GFLOP/s")
if other16:
    print(f"OTHER binary's Muon step with --muon-bf16 {other16:.3f} s (this build "
          f"{other16 / muon16:.2f}x faster); its Newton-Schulz >= {ns / (other16 - adam) / 1e9:.1f} GFLOP/s")
PY
