#!/usr/bin/env python3
"""Expert-load balance of ZAYA1 training runs, from their metrics.jsonl.

For each run directory, over the steps after the warm-up: per step, each MoE
layer's max/min tokens per expert (inf when an expert got none), summarised
as the median over steps of the worst layer and of the median layer, the
share of (layer, step) pairs <= 1.5 and of steps with every layer <= 1.5;
the same for the loads summed over consecutive groups of GROUP steps (a
global batch GROUP times larger, with the biases of those steps); the
max/min of the loads summed over the last WINDOW steps; the routing entropy
(nats; uniform over 16 experts = 2.77), the skip rate and the losses; and
the first step from which on every step has every layer <= 1.5 (over all
steps, warm-up included; none if the last step has a layer above). Usage:
  bench/zaya_balance.py [--warmup 50] [--window 50] [--group 4] [--json OUT] RUN_DIR...
"""
import argparse, json, math, statistics as st, sys


def ratio(load):
    lo, hi = min(load), max(load)
    return math.inf if lo == 0 else hi / lo


def summed(steps, layer):
    """Loads of the experts (not skip) of one layer summed over steps."""
    n = len(steps[0]["router"][layer]["load"]) - 1
    return [sum(r["router"][layer]["load"][e] for r in steps) for e in range(n)]


def grouped(steps, size):
    """Per group of `size` consecutive steps: each layer's max/min of the summed loads."""
    layers = len(steps[0]["router"])
    return [[ratio(summed(steps[i:i + size], l)) for l in range(layers)]
            for i in range(0, len(steps) - size + 1, size)]


def shares(per):
    """(share of (layer, group) pairs <= 1.5, share of groups with every layer <= 1.5)."""
    flat = [x for g in per for x in g]
    return (sum(x <= 1.5 for x in flat) / len(flat), sum(all(x <= 1.5 for x in g) for g in per) / len(per))


def settled_from(routed):
    """First step from which on every step has every layer <= 1.5, or None."""
    first = None
    for r in reversed(routed):
        if max(ratio(l["load"][:-1]) for l in r["router"]) > 1.5:
            break
        first = r["step"]
    return first


def summarise(path, warmup, window, group):
    rows = [json.loads(l) for l in open(path + "/metrics.jsonl") if l.strip()]
    settled = settled_from([r for r in rows if "router" in r])
    steps = [r for r in rows if "router" in r and r["step"] > warmup]
    if not steps:
        return None
    per_step = grouped(steps, 1)
    per_group = grouped(steps, group)
    last = steps[-window:]
    windowed = [ratio(summed(last, l)) for l in range(len(last[0]["router"]))]
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None and r.get("val_loss", -1) >= 0]
    pair, every = shares(per_step)
    gpair, gevery = shares(per_group)
    return {"run": path, "steps": rows[-1]["step"], "warmup": warmup,
            "per_step_worst_layer_median": st.median(max(p) for p in per_step),
            "per_step_median_layer_median": st.median(st.median(p) for p in per_step),
            "layer_steps_le_1.5": pair, "steps_all_layers_le_1.5": every,
            "all_layers_le_1.5_from_step": settled,
            "group": group, "groups": len(per_group),
            "group_median_layer_median": st.median(st.median(p) for p in per_group),
            "group_worst": max(max(p) for p in per_group),
            "layer_groups_le_1.5": gpair, "groups_all_layers_le_1.5": gevery,
            "window": len(last), "windowed_max_over_min_worst": max(windowed),
            "windowed_max_over_min_median": st.median(windowed),
            "entropy_mean": st.mean(st.mean(l["entropy"] for l in r["router"]) for r in steps),
            "skip_rate_mean": st.mean(st.mean(l["skip_rate"] for l in r["router"]) for r in steps),
            "train_loss_last10": st.mean(r["loss"] for r in rows[-10:]),
            "val_loss_last": vals[-1] if vals else None,
            "tokens_per_s_median": st.median(r["tokens_per_s"] for r in rows[1:])}


def fmt(x):
    return "inf" if x == math.inf else f"{x:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    out = [s for s in (summarise(r, a.warmup, a.window, a.group) for r in a.runs) if s]
    print(f"per step: median over steps of the median / worst layer's max/min, share of (layer, step) "
          f"<= 1.5, share of steps with all layers <= 1.5; the same for loads summed over groups of "
          f"{a.group} steps; loads summed over the last {a.window} steps")
    print(f"{'run':<28}{'steps':>6}{'med/step':>9}{'worst':>8}{'pairs':>7}{'all':>6}"
          f"{'med/grp':>9}{'pairs':>7}{'all':>6}{'win med':>8}{'worst':>8}{'entropy':>8}{'skip':>6}"
          f"{'train':>7}{'val':>7}{'tok/s':>7}{'settled':>8}")
    for s in out:
        print(f"{s['run'][-28:]:<28}{s['steps']:>6}{fmt(s['per_step_median_layer_median']):>9}"
              f"{fmt(s['per_step_worst_layer_median']):>8}{100*s['layer_steps_le_1.5']:>6.0f}%"
              f"{100*s['steps_all_layers_le_1.5']:>5.0f}%{fmt(s['group_median_layer_median']):>9}"
              f"{100*s['layer_groups_le_1.5']:>6.0f}%{100*s['groups_all_layers_le_1.5']:>5.0f}%"
              f"{fmt(s['windowed_max_over_min_median']):>8}{fmt(s['windowed_max_over_min_worst']):>8}"
              f"{s['entropy_mean']:>8.2f}{100*s['skip_rate_mean']:>5.1f}%{s['train_loss_last10']:>7.3f}"
              f"{(s['val_loss_last'] or float('nan')):>7.3f}{s['tokens_per_s_median']:>7.0f}"
              f"{s['all_layers_le_1.5_from_step'] or '-':>8}")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=2, default=lambda x: None)


if __name__ == "__main__":
    sys.exit(main())
