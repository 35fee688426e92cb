#!/usr/bin/env bash
# `anvil plan` against published large-scale training runs.
# bench/published/runs.json lists each run (source, model config in
# bench/published/, GPUs, parallel layout, precision, the published tokens/s
# per GPU or MFU); this predicts every one on its hardware profile with
# `anvil plan` and prints prediction, publication and error, with the median
# absolute error, for the in-set rows and apart for the held-out ones (rows
# marked held_out: added after the planner's terms were set, no constant chosen
# with them in view). Nothing is measured here, nothing fitted to these rows:
# the profile's datasheet figures and its cited fractions and kernel rates
# are all the planner gets. Writes bench/results/plan_published.json.
# Usage: bench/plan_published.sh [RUNS_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-bench/published/runs.json}
anvil=build/anvil
[ -x "$anvil" ] || scripts/build.sh
mkdir -p bench/results
/usr/bin/python3 - "$anvil" "$runs" <<'PY'
import json, statistics as st, subprocess, sys
anvil, path = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
hw = doc["hw"]
rows = []
print(f"anvil plan vs published training runs ({hw} profile: datasheet x cited achievable fractions)")
print(f"{'run':<28}{'rows':>9}{'GPUs':>7}{'layout':>26}{'prec':>6}{'metric':>10}{'published':>11}{'predicted':>11}{'error':>8}")
for r in doc["runs"]:
    dp = r["gpus"] // (r["tp"] * r["pp"] * r["cp"])
    cmd = [anvil, "plan", "--hw", hw, "--config", f"bench/published/{r['config']}.json",
           "--dtype", r["dtype"], "--seq", str(r["seq"]), "--micro-batch", str(r["micro_batch"]),
           "--global-batch", str(r["global_batch"]), "--dp", str(dp), "--tp", str(r["tp"]),
           "--pp", str(r["pp"]), "--vp", str(r["vp"]), "--cp", str(r["cp"]), "--json"]
    if r.get("recompute_layers"):
        cmd += ["--recompute-layers", str(r["recompute_layers"])]
    if r["sharding"] == "zero":
        cmd.append("--zero")
    elif r["sharding"] == "fsdp":
        cmd.append("--fsdp")
    p = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if r["metric"] == "mfu":
        pred, pub, shown = p["mfu"], r["published"], lambda v: f"{v:.1%}"
    else:
        pred, pub, shown = p["tokens_per_s"] / r["gpus"], r["published"], lambda v: f"{v:,.0f}"
    err = pred / pub - 1
    layout = f"dp{dp} tp{r['tp']} pp{r['pp']}" + (f"v{r['vp']}" if r["vp"] > 1 else "") + \
             (f" cp{r['cp']}" if r["cp"] > 1 else "")
    metric = "MFU" if r["metric"] == "mfu" else "tok/s/GPU"
    held = r.get("held_out", False)
    print(f"{r['id']:<28}{'held-out' if held else 'in-set':>9}{r['gpus']:>7}{layout:>26}{r['dtype']:>6}"
          f"{metric:>10}{shown(pub):>11}{shown(pred):>11}{err:>+8.0%}")
    rows.append({**r, "dp": dp, "predicted": pred, "error": err, "step_s": p["step_s"],
                 "parts": {"compute_s": p["compute_s"], "comm_exposed_s": p["comm_exposed_s"],
                           "optimizer_s": p["optimizer_s"]},
                 "memory_gib": p["memory_bytes"]["total"] / 2**30, "command": " ".join(cmd[1:])})
errs = [abs(x["error"]) for x in rows]
summary = {}
for name, part in (("in-set", [x for x in rows if not x.get("held_out")]),
                   ("held-out", [x for x in rows if x.get("held_out")])):
    e = [abs(x["error"]) for x in part]
    if not e:
        continue
    within = sum(1 for v in e if v <= 0.20)
    summary[name] = {"runs": len(e), "median_abs_error": st.median(e), "max_abs_error": max(e),
                     "within_20pct": within}
    print(f"{name}: {len(e)} runs; median |error| {st.median(e):.1%}, max {max(e):.1%}, "
          f"{within} of {len(e)} within 20%")
print(f"all: {len(rows)} runs; median |error| {st.median(errs):.1%}, max {max(errs):.1%}")
print("sources:")
for s in sorted({x["source"] for x in rows}):
    print(f"  {s}")
json.dump({"hw": hw, "median_abs_error": st.median(errs), "summary": summary, "rows": rows},
          open("bench/results/plan_published.json.tmp", "w"), indent=2)
PY
mv bench/results/plan_published.json.tmp bench/results/plan_published.json
