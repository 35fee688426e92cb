"""anvil train --tensorboard, read back by TensorBoard's own reader.

    tensorboard_check.py --anvil BIN --work DIR

Trains a small ZAYA1 model a few steps with --tensorboard and validation,
loads the event files with tensorboard's EventAccumulator, and requires
every scalar of metrics.jsonl (loss, lr, grad norm, tokens/s, validation
loss, router skip rate) at every step, equal as float32.
"""
import json
import os
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from interop_common import ROOT, fresh, parser, run as run_anvil

args = parser(__doc__).parse_args()
fresh(args.work)
run, tb = os.path.join(args.work, "run"), os.path.join(args.work, "tb")
run_anvil([args.anvil, "train", "--config", os.path.join(ROOT, "tests/configs/zaya-tiny.json"),
                    "--set", "vocab_size=256", "--data", os.path.join(ROOT, "README.md"),
                    "-B", "2", "-T", "32", "--steps", "6", "--val-every", "3", "--peak-gflops", "1",
                    "--out", run, "--tensorboard", tb])
acc = EventAccumulator(tb)
acc.Reload()
tags = set(acc.Tags()["scalars"])
metrics = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
want = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
        "perf/tokens_per_s": "tokens_per_s", "val/loss": "val_loss"}
for tag, key in want.items():
    if tag not in tags:
        sys.exit(f"FAILED: tag {tag} missing (have {sorted(tags)})")
    got = {e.step: e.value for e in acc.Scalars(tag)}
    exp = {m["step"]: m[key] for m in metrics if key in m}
    if sorted(got) != sorted(exp):
        sys.exit(f"FAILED: {tag}: steps {sorted(got)} vs {sorted(exp)}")
    for s, v in exp.items():
        if np.float32(v) != np.float32(got[s]):
            sys.exit(f"FAILED: {tag} at step {s}: {got[s]} vs {v}")
    print(f"  {tag}: {len(got)} steps equal to metrics.jsonl")
# The step's parts (metrics.jsonl "parts_s") as perf/<part>_s.
for part in ("gemm", "attention", "experts", "other", "optimizer"):
    tag = f"perf/{part}_s"
    if tag not in tags:
        sys.exit(f"FAILED: tag {tag} missing (have {sorted(tags)})")
    got = {e.step: e.value for e in acc.Scalars(tag)}
    exp = {m["step"]: m["parts_s"][part] for m in metrics}
    if any(np.float32(v) != np.float32(got.get(s, np.nan)) for s, v in exp.items()):
        sys.exit(f"FAILED: {tag}: {got} vs metrics.jsonl {exp}")
skip = [t for t in tags if t.startswith("router/") and t.endswith("skip_rate")]
if not skip:
    sys.exit("FAILED: no router skip-rate scalars")
print(f"tensorboard: {len(tags)} tags read back by EventAccumulator: ok")
