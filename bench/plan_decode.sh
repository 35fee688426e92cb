#!/usr/bin/env bash
# `anvil plan`'s decode latency against `anvil generate` on this machine.
# The planner prices a decode step at batch 1 as one read of the active
# weights, the classifier and the KV cache at the profile's memory bandwidth
# (docs/plan.md); no decode measurement went into it, so every row is
# held out. Each round measures this machine's profile (anvil hw --profile),
# then for every config generates 128 tokens greedily from a 1-token prompt
# (fp32, the CPU's threads) and predicts a step at the last token's context
# (129) from that round's profile. Configs get random-init checkpoints (one
# training step on random tokens): decode time does not depend on the values.
# Prints medians of predicted and measured tokens/s and the error, and
# writes bench/results/plan_decode.json.
# Usage: bench/plan_decode.sh [ROUNDS (default 3)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: expected a positive integer, got '$rounds'" >&2; exit 2; }
anvil=${ANVIL:-build/anvil}
if [ -z "${ANVIL:-}" ]; then
  [ -x "$anvil" ] || scripts/build.sh
else
  [ -x "$anvil" ] || { echo "ANVIL: expected an anvil binary, got '$anvil'" >&2; exit 2; }
fi
configs="gpt2-124m llama-style zaya-small byte-small"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for c in $configs; do
  echo "checkpoint: $c" >&2
  "$anvil" train --config "configs/$c.json" --steps 1 -B 1 -T 16 --out "$out/run-$c" \
    --log-every 1000 > /dev/null
done
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: profile" >&2
  "$anvil" hw --profile "$out/hw-$r.json" --min-time 0.1 > /dev/null
  for c in $configs; do
    echo "round $r/$rounds: $c" >&2
    "$anvil" generate --checkpoint "$out/run-$c" --prompt-tokens 1 --max-new 128 \
      --temperature 0 2>&1 > /dev/null | tail -1 > "$out/gen-$c-$r.txt"
    "$anvil" plan --config "configs/$c.json" --hw "$out/hw-$r.json" --dtype f32 -T 129 --json \
      > "$out/plan-$c-$r.json"
  done
done
python3 - "$out" "$rounds" "$configs" <<'PY'
import json, os, re, statistics, sys, datetime
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
rows = []
for c in configs:
    measured, predicted = [], []
    for r in range(1, rounds + 1):
        text = open(f"{out}/gen-{c}-{r}.txt").read()
        m = re.search(r"at ([0-9.]+) tokens/s", text)
        if not m:
            sys.exit(f"plan_decode: no tokens/s in anvil generate's output for {c}: {text!r}")
        measured.append(float(m.group(1)))
        predicted.append(1 / json.load(open(f"{out}/plan-{c}-{r}.json"))["decode_s_per_token"])
    med_m, med_p = statistics.median(measured), statistics.median(predicted)
    rows.append({"config": c, "measured_tokens_per_s": measured, "predicted_tokens_per_s": predicted,
                 "median_measured": med_m, "median_predicted": med_p,
                 "error": med_p / med_m - 1})
hw = json.load(open(f"{out}/hw-1.json"))
print(f"anvil plan decode (batch 1, fp32, context 129) vs anvil generate, medians of {rounds} rounds")
print(f"{'config':<14}{'measured tok/s':>16}{'predicted tok/s':>17}{'error':>8}")
for x in rows:
    print(f"{x['config']:<14}{x['median_measured']:>16.1f}{x['median_predicted']:>17.1f}{100 * x['error']:>+7.0f}%")
errs = [abs(x["error"]) for x in rows]
print(f"median |error| {100 * statistics.median(errs):.0f}%, max {100 * max(errs):.0f}%")
res = {"date": datetime.date.today().isoformat(), "rounds": rounds,
       "device": hw.get("device"), "memory_bandwidth_gbs": hw.get("memory_bandwidth_gbs"),
       "rows": rows, "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
tmp = "bench/results/plan_decode.json.tmp"
with open(tmp, "w") as f:
    json.dump(res, f, indent=2)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, "bench/results/plan_decode.json")
PY
