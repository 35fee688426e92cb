#!/usr/bin/env python3
"""Compares the per-step losses of two `anvil train --json-out` summaries
(scripts/gpu-check.sh: the same run on the CPU and on a GPU) and prints one
JSON line: the largest relative difference, at which step, and whether it
is within --tol. Exit 0 within it, 1 outside it, 2 on unreadable input."""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("reference", help="summary JSON of the reference run (the CPU)")
    p.add_argument("other", help="summary JSON of the run compared (the GPU)")
    p.add_argument("--tol", type=float, required=True, help="largest relative difference allowed")
    p.add_argument("--label", default="", help="a name for the printed line")
    a = p.parse_args()
    try:
        ref = json.load(open(a.reference))["losses"]
        got = json.load(open(a.other))["losses"]
    except (OSError, ValueError, KeyError) as e:
        print(f"loss_parity: cannot read the losses: {e}", file=sys.stderr)
        return 2
    if len(ref) != len(got) or not ref:
        print(f"loss_parity: {len(ref)} reference losses, {len(got)} compared", file=sys.stderr)
        return 1
    rel = [abs(g - r) / abs(r) for r, g in zip(ref, got)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    ok = rel[worst] <= a.tol
    print(json.dumps({"label": a.label, "steps": len(ref), "max_relative_difference": rel[worst],
                      "at_step": worst + 1, "reference_loss": ref[worst], "loss": got[worst],
                      "final_reference": ref[-1], "final": got[-1], "tol": a.tol, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
