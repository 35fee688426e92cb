#!/usr/bin/env bash
# Quick start: install what is missing, build, and run the main job on its
# default: describe the machine, then a short GEMM benchmark with baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/anvil hw
echo
build/anvil bench gemm --sizes 256,1024,2048
