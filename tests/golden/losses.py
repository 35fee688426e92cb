#!/usr/bin/env python3
"""Prints the trajectory part of an `anvil train --json-out` summary (losses,
validation loss, first step) as JSON, exactly: Python's floats round-trip."""
import json
import sys

with open(sys.argv[1]) as f:
    summary = json.load(f)
print(json.dumps({k: summary[k] for k in ("first_step", "losses", "val_loss")}, indent=1))
