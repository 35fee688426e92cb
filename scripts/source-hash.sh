#!/usr/bin/env bash
# Prints a short hash of the sources anvil's binaries are built from
# (src/, apps/, tests/ and CMakeLists.txt, by path and content), the same
# with or without git: scripts/gpu-bundle.sh writes it into the bundle and
# scripts/gpu-check.sh compares it with the tree it runs in, whose copy on a
# GPU machine may have no .git. In a git checkout the files are those git
# tracks or would (what a copy of the working tree takes: not the ignored
# ones); elsewhere every file there is.
#
#   scripts/source-hash.sh [REPO]      default REPO: this script's checkout
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
list() {
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git ls-files -z -co --exclude-standard -- src apps tests CMakeLists.txt
  else
    find src apps tests CMakeLists.txt -type f -print0
  fi
}
list | tr '\0' '\n' | grep -v -e '/__pycache__/' -e '\.pyc$' | LC_ALL=C sort |
  while IFS= read -r f; do [[ -f $f ]] && printf '%s\0' "$f"; done |
  xargs -0 sha256sum | sha256sum | cut -c1-16
