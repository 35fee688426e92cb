#!/usr/bin/env python3
"""Expert-load balance of ZAYA1 training runs, from their metrics.jsonl.

For each run directory: per step, each MoE layer's max/min tokens per expert
(inf when an expert got none), summarised after the warm-up as the median
over steps of the worst layer and of the median layer, the share of steps in
which every layer is <= 1.5, the max/min of the loads summed over the last
WINDOW steps, the routing entropy (nats; uniform over 16 experts = 2.77),
the skip rate and the losses. Usage:
  bench/zaya_balance.py [--warmup 50] [--window 50] [--json OUT] RUN_DIR...
"""
import argparse, json, math, statistics as st, sys


def summarise(path, warmup, window):
    rows = [json.loads(l) for l in open(path + "/metrics.jsonl") if l.strip()]
    steps = [r for r in rows if "router" in r and r["step"] > warmup]
    if not steps:
        return None
    def ratio(load):
        lo, hi = min(load), max(load)
        return math.inf if lo == 0 else hi / lo
    worst, median_layer, ok, entropy, skip = [], [], 0, [], []
    for r in steps:
        per = [ratio(l["load"][:-1]) for l in r["router"]]
        worst.append(max(per))
        median_layer.append(st.median(per))
        ok += all(x <= 1.5 for x in per)
        entropy.append(st.mean(l["entropy"] for l in r["router"]))
        skip.append(st.mean(l["skip_rate"] for l in r["router"]))
    last = steps[-window:]
    windowed = []
    for i in range(len(last[0]["router"])):
        tot = [sum(r["router"][i]["load"][e] for r in last) for e in range(len(last[0]["router"][i]["load"]) - 1)]
        windowed.append(ratio(tot))
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None and r.get("val_loss", -1) >= 0]
    return {"run": path, "steps": rows[-1]["step"], "warmup": warmup,
            "per_step_worst_layer_median": st.median(worst),
            "per_step_median_layer_median": st.median(median_layer),
            "steps_all_layers_le_1.5": ok / len(steps),
            "window": len(last), "windowed_max_over_min_worst": max(windowed),
            "windowed_max_over_min_median": st.median(windowed),
            "entropy_mean": st.mean(entropy), "skip_rate_mean": st.mean(skip),
            "train_loss_last10": st.mean(r["loss"] for r in rows[-10:]),
            "val_loss_last": vals[-1] if vals else None,
            "tokens_per_s_median": st.median(r["tokens_per_s"] for r in rows[1:])}


def fmt(x):
    return "inf" if x == math.inf else f"{x:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    out = [s for s in (summarise(r, a.warmup, a.window) for r in a.runs) if s]
    print(f"{'run':<28}{'steps':>6}{'worst/step':>11}{'median/step':>12}{'all<=1.5':>9}"
          f"{'window worst':>13}{'window med':>11}{'entropy':>8}{'skip':>6}{'train':>7}{'val':>7}{'tok/s':>7}")
    for s in out:
        print(f"{s['run'][-28:]:<28}{s['steps']:>6}{fmt(s['per_step_worst_layer_median']):>11}"
              f"{fmt(s['per_step_median_layer_median']):>12}{100*s['steps_all_layers_le_1.5']:>8.0f}%"
              f"{fmt(s['windowed_max_over_min_worst']):>13}{fmt(s['windowed_max_over_min_median']):>11}"
              f"{s['entropy_mean']:>8.2f}{100*s['skip_rate_mean']:>5.1f}%{s['train_loss_last10']:>7.3f}"
              f"{(s['val_loss_last'] or float('nan')):>7.3f}{s['tokens_per_s_median']:>7.0f}")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=2, default=lambda x: None)


if __name__ == "__main__":
    sys.exit(main())
