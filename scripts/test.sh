#!/usr/bin/env bash
# Installs what is missing (with the test clients), builds with warnings as
# errors, runs every test; then every fuzz harness for 30 s and the unit
# tests under AddressSanitizer + UBSan (docs/contributing.md says what each
# costs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests
scripts/build.sh -DANVIL_WERROR=ON -DANVIL_BUILD_TESTS=ON
(cd build && ctest --output-on-failure --timeout 600)
fuzz/run.sh 30
scripts/sanitize.sh address
