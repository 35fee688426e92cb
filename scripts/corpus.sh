#!/usr/bin/env bash
# The default training corpus, from what Debian ships (docs/recipe.md):
#   prose  the King James Bible (bible-kjv), the fortune cookie collections
#          (fortunes: quotations, verse, literature) and the licence texts
#          in /usr/share/common-licenses
#   code   C and C++ headers under /usr/include and Python's standard
#          library (/usr/lib/python3.11), a sorted, capped selection
#   arith  generated arithmetic ("317 + 48 = 365"), a fixed pseudo-random
#          sequence
# then a SentencePiece BPE tokenizer (4096) trained on all three and one
# token file per source (with its .json sidecar). Deterministic: the same
# packages give the same bytes. Writes data/corpus/; does nothing for files
# already there (delete the directory to rebuild).
#   scripts/corpus.sh [ANVIL=build/anvil]
set -euo pipefail
cd "$(dirname "$0")/.."
anvil=${1:-build/anvil}
[ -x "$anvil" ] || { echo "scripts/corpus.sh: build first (scripts/build.sh)" >&2; exit 2; }
command -v bible >/dev/null && [ -d /usr/share/games/fortunes ] || scripts/install-deps.sh
out=data/corpus
mkdir -p "$out"
cap() { head -c "$1"; }  # bytes

# Writes $out/$1.txt from the command's output, atomically.
make_text() {
  local name=$1; shift
  [ -s "$out/$name.txt" ] && return
  "$@" > "$out/$name.txt.tmp"
  mv "$out/$name.txt.tmp" "$out/$name.txt"
}

prose() {
  scripts/kjv-text.sh >/dev/null
  cat data/kjv.txt
  # Fortunes: every plain-text collection (not the .dat indexes, not the
  # offensive ones), '%' separators turned into blank lines.
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort |
    xargs cat | sed 's/^%$//'
  find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat
}

code() (
  set +o pipefail  # head closes the pipe early on purpose
  { find /usr/include -name '*.h' -size -64k | LC_ALL=C sort | head -4000 | xargs cat 2>/dev/null | cap 3000000
    find /usr/lib/python3.11 -maxdepth 1 -name '*.py' | LC_ALL=C sort | xargs cat 2>/dev/null | cap 2000000
  } | iconv -f utf-8 -t utf-8 -c
)

arith() {
  awk 'BEGIN {
    x = 12345
    for (i = 0; i < 60000; i++) {
      x = (x * 1103515245 + 12345) % 2147483648; a = x % 1000
      x = (x * 1103515245 + 12345) % 2147483648; b = x % 1000
      x = (x * 1103515245 + 12345) % 2147483648; op = x % 3
      if (op == 0) printf "%d + %d = %d\n", a, b, a + b
      else if (op == 1) printf "%d - %d = %d\n", a, b, a - b
      else printf "%d * %d = %d\n", a % 100, b % 100, (a % 100) * (b % 100)
    }
  }'
}

make_text prose prose
make_text code code
make_text arith arith

if [ ! -s "$out/tokenizer.model" ]; then
  "$anvil" data tokenizer train --text "$out/prose.txt" "$out/code.txt" "$out/arith.txt" \
    --vocab 4096 --out "$out/tokenizer"
fi
for s in prose code arith; do
  [ -s "$out/$s.tok" ] && [ -s "$out/$s.tok.json" ] && continue
  "$anvil" data tokenize --text "$out/$s.txt" --tokenizer "$out/tokenizer.model" \
    --out "$out/$s.tok" --verify
done
for s in prose code arith; do
  printf '%s: %s bytes\n' "$out/$s.txt" "$(wc -c < "$out/$s.txt")"
done
