#!/usr/bin/env bash
# Installs what is missing (with the test clients), builds with warnings as
# errors, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests
scripts/build.sh -DANVIL_WERROR=ON -DANVIL_BUILD_TESTS=ON
cd build
ctest --output-on-failure --timeout 600
