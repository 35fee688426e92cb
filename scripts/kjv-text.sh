#!/usr/bin/env bash
# Writes the King James Bible (public domain; Debian's bible-kjv package) as
# plain text to data/kjv.txt (4.3 MB), the demo corpus for `anvil train`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v bible >/dev/null || scripts/install-deps.sh
mkdir -p data
if [ ! -s data/kjv.txt ]; then
  bible gen1:1-rev22:21 > data/kjv.txt.tmp
  mv data/kjv.txt.tmp data/kjv.txt
fi
echo "data/kjv.txt: $(wc -c < data/kjv.txt) bytes"
