#!/usr/bin/env bash
# Configures and builds anvil (Release, -march=native) into build/.
# Extra arguments go to cmake's configure step, e.g. -DANVIL_NATIVE=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
