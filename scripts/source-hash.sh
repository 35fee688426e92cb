#!/usr/bin/env bash
# Prints a short hash of the sources anvil's binaries are built from
# (src/, apps/, tests/ and CMakeLists.txt, by path and content), the same
# with or without git: scripts/gpu-bundle.sh writes it into the bundle and
# scripts/gpu-check.sh compares it with the tree it runs in, whose copy on a
# GPU machine may have no .git.
#
#   scripts/source-hash.sh [REPO]      default REPO: this script's checkout
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
find src apps tests CMakeLists.txt -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
