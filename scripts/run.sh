#!/usr/bin/env bash
# Quick start: install what is missing, build, and run the main job on its
# default: describe the machine, train a small byte-level decoder on the King
# James Bible for 150 steps (checkpoints in runs/quickstart), and sample
# from it. Extra arguments go to `anvil train` (e.g. --steps 300 --precision bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DANVIL_BUILD_TESTS=OFF
build/anvil hw
echo
scripts/kjv-text.sh
# The demo starts over each time: anvil train continues a run directory that
# holds checkpoints only when asked to (--resume latest, passed through).
case " $* " in *" --resume"*) ;; *) rm -rf runs/quickstart ;; esac
build/anvil train --config configs/byte-small.json --data data/kjv.txt -B 16 -T 256 \
  --steps 150 --lr 2e-3 --warmup 20 --val-every 50 --out runs/quickstart "$@"
echo
build/anvil generate --checkpoint runs/quickstart --prompt "And it came to pass" --max-new 200
