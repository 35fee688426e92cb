#!/usr/bin/env bash
# Training throughput of anvil against PyTorch 2 (the project venv's torch and
# transformers, scripts/install-deps.sh) in eager mode and under torch.compile,
# fp32 and bf16 (anvil --precision bf16 against torch.autocast bf16), on
# gpt2-124m (B=4, T=256) and zaya-small (B=8, T=256), 2 threads.
#
# PyTorch trains the transformers model that `anvil ckpt export --hf` makes of
# an anvil run of the same config (GPT2LMHeadModel, ZayaForCausalLM), so the
# architecture and the starting weights are anvil's; zaya-small runs with
# skip_output=zero, the skip class transformers implements. For zaya-small
# each of transformers' experts implementations is tried once (eager,
# batched_mm, grouped_mm) and the fastest is the one timed; a 2-step probe on
# a shared host can pick a slower one, so EXPERTS=grouped_mm (or eager,
# batched_mm) names it instead.
#
# Every round runs each variant once, interleaved; the table gives medians of
# the rounds and anvil's ratio to each PyTorch variant and to the faster one.
# A variant that fails (e.g. a model the installed transformers lacks) is shown as
# "-" with its error in the log. Writes bench/results/torch_compare.json.
# Usage: bench/torch_compare.sh [ROUNDS (default 3)] [STEPS (default 3)]
# MODELS=zaya-small (or gpt2-124m) runs one model only (results in
# bench/results/torch_compare-MODELS.json); KEEP=DIR keeps the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-3}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
python=.venv/bin/python
[ -x "$python" ] || { echo "bench/torch_compare.sh: .venv is missing: run scripts/install-deps.sh" >&2; exit 1; }
export OMP_NUM_THREADS=2
out=${KEEP:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$out"' EXIT
# name|config|B|T|--set overrides
models="gpt2-124m|configs/gpt2-124m.json|4|256|
zaya-small|configs/zaya-small.json|8|256|--set skip_output=zero"
if [ -n "${MODELS:-}" ]; then
  models=$(grep -E "^(${MODELS//,/|})\|" <<< "$models") ||
    { echo "MODELS: expected gpt2-124m and/or zaya-small, got '$MODELS'" >&2; exit 2; }
fi
case "${EXPERTS:-}" in
  "" | eager | batched_mm | grouped_mm) ;;
  *) echo "EXPERTS: expected eager, batched_mm or grouped_mm, got '$EXPERTS'" >&2; exit 2 ;;
esac
while IFS='|' read -r name config B T sets; do
  echo "$name: anvil run + Hugging Face export" >&2
  "$anvil" train --config "$config" $sets -B "$B" -T "$T" --steps 1 --out "$out/run-$name" \
    --log-every 1000 < /dev/null > /dev/null
  "$anvil" ckpt export --hf --checkpoint "$out/run-$name" --out "$out/hf-$name" > /dev/null
done <<< "$models"
experts=eager
best=0
impls="eager batched_mm grouped_mm"
grep -q '^zaya-small|' <<< "$models" || impls=""
if [ -n "${EXPERTS:-}" ]; then
  experts=$EXPERTS
  impls=""
fi
for impl in $impls; do
  echo "zaya-small: transformers experts implementation $impl (1 probe run)" >&2
  if "$python" bench/torch_train_hf.py --model "$out/hf-zaya-small" -B 8 -T 256 --steps 2 \
      --experts "$impl" > "$out/probe-$impl.json" 2>> "$out/errors.log"; then
    tps=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens_per_second'])" \
      "$out/probe-$impl.json")
    if "$python" -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" \
        "$tps" "$best"; then
      best=$tps
      experts=$impl
    fi
  fi
done
echo "zaya-small: timing with experts implementation $experts" >&2
for r in $(seq 1 "$rounds"); do
  while IFS='|' read -r name config B T sets; do
    for p in fp32 bf16; do
      echo "round $r/$rounds: $name anvil $p ($((steps + 1)) steps)" >&2
      "$anvil" train --config "$config" $sets -B "$B" -T "$T" --steps $((steps + 1)) \
        --precision "$p" --log-every 1000 --json-out "$out/anvil-$name-$p-$r.json" \
        < /dev/null > /dev/null 2>> "$out/errors.log" || rm -f "$out/anvil-$name-$p-$r.json"
      for mode in eager compile; do
        echo "round $r/$rounds: $name torch $mode $p" >&2
        flag=(); [ "$mode" = compile ] && flag=(--compile)
        # A compile that has not finished its steps in 10 minutes counts as failed.
        timeout 600 "$python" bench/torch_train_hf.py --model "$out/hf-$name" -B "$B" -T "$T" --steps "$steps" \
          --dtype "$p" --experts "$experts" "${flag[@]}" > "$out/torch-$name-$mode-$p-$r.json" \
          2>> "$out/errors.log" || rm -f "$out/torch-$name-$mode-$p-$r.json"
      done
    done
  done <<< "$models"
done
mkdir -p bench/results
result="bench/results/torch_compare${MODELS:+-${MODELS//,/-}}.json"
"$python" - "$out" "$rounds" "$experts" "$result" <<'PY'
import json, os, statistics as st, sys
out, rounds, experts, result = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def runs(prefix, key="tokens_per_second"):
    vals = []
    for r in range(1, rounds + 1):
        f = f"{out}/{prefix}-{r}.json"
        if os.path.exists(f):
            vals.append(json.load(open(f))[key])
    return vals
med = lambda v: st.median(v) if v else None
f1 = lambda x: f"{x:.1f}" if x is not None else "-"
f2 = lambda x: f"{x:.2f}x" if x is not None else "-"
import torch
timed_zaya = bool(runs("anvil-zaya-small-fp32") or runs("torch-zaya-small-eager-fp32"))
print(f"anvil vs PyTorch {torch.__version__} (transformers models, SDPA attention"
      + (f"; zaya-small experts: {experts}" if timed_zaya else "")
      + f"), 2 threads, tokens/s, medians of {rounds} rounds")
print(f"{'model':<11}{'prec':>5}{'anvil':>9}{'eager':>9}{'compile':>9}{'1st compiled s':>16}"
      f"{'anvil/eager':>13}{'anvil/compile':>15}{'anvil/faster':>14}")
rows = []
for name in ("gpt2-124m", "zaya-small"):
    if not runs(f"anvil-{name}-fp32") and not runs(f"torch-{name}-eager-fp32"):
        continue  # not selected (MODELS)
    for p in ("fp32", "bf16"):
        a = runs(f"anvil-{name}-{p}")
        e = runs(f"torch-{name}-eager-{p}")
        c = runs(f"torch-{name}-compile-{p}")
        first = runs(f"torch-{name}-compile-{p}", "first_step_seconds")
        ma, me, mc = med(a), med(e), med(c)
        faster = max(x for x in (me, mc) if x is not None) if (me or mc) else None
        ratio = lambda x: ma / x if ma and x else None
        print(f"{name:<11}{p:>5}{f1(ma):>9}{f1(me):>9}{f1(mc):>9}{f1(med(first)):>16}"
              f"{f2(ratio(me)):>13}{f2(ratio(mc)):>15}{f2(ratio(faster)):>14}")
        rows.append({"model": name, "precision": p, "anvil_runs": a, "eager_runs": e,
                     "compile_runs": c, "compile_first_step_seconds": first,
                     "anvil_tokens_per_s": ma, "eager_tokens_per_s": me, "compile_tokens_per_s": mc,
                     "anvil_over_eager": ratio(me), "anvil_over_compile": ratio(mc),
                     "anvil_over_faster": ratio(faster)})
json.dump({"rounds": rounds, "torch": torch.__version__, "zaya_experts_implementation": experts,
           "rows": rows}, open(result + ".tmp", "w"), indent=2)
os.replace(result + ".tmp", result)
PY
if [ -s "$out/errors.log" ]; then
  echo "errors of the variants shown as - (last lines):" >&2
  grep -i -E 'error|exception' "$out/errors.log" | sort | uniq -c | tail -n 8 >&2 || true
fi
