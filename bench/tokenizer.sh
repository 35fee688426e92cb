#!/usr/bin/env bash
# Tokenizer speed: anvil's C++ encoder (libsentencepiece, lines cut over
# THREADS threads) against the Python sentencepiece binding (Debian's
# python3-sentencepiece, the same library version) with the same model on
# the same text, interleaved, ROUNDS rounds, median MB/s of each. Both
# produce the same ids (checked every round) and anvil's round trip is
# checked byte for byte (--verify).
#   bench/tokenizer.sh [ROUNDS=3] [THREADS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
threads=${2:-2}
anvil=build/anvil
[ -x "$anvil" ] || { echo "bench/tokenizer.sh: build first (scripts/build.sh)" >&2; exit 2; }
scripts/kjv-text.sh >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The corpus: KJV (prose) plus anvil's own C++ sources (code), 5 MB or so.
cat data/kjv.txt src/anvil/*/*.cpp src/anvil/*/*.hpp > "$work/corpus.txt"
"$anvil" data tokenizer train --text data/kjv.txt --vocab 4096 --out "$work/tk" 2>&1 | sed 's/^/  /'
bytes=$(wc -c < "$work/corpus.txt")
echo "corpus: $bytes bytes (data/kjv.txt + src/anvil sources), BPE 4096, $threads threads"
anvil_rates=() python_rates=()
for r in $(seq "$rounds"); do
  out=$("$anvil" data tokenize --text "$work/corpus.txt" --tokenizer "$work/tk.model" \
        --out "$work/corpus.tok" --threads "$threads" --verify 2>&1)
  s=$(echo "$out" | sed -n 's/.* in \([0-9.e-]*\) s on .*/\1/p')
  a=$(python3 -c "print(f'{$bytes / $s / 1e6:.3f}')")
  p=$(/usr/bin/python3 bench/tokenizer_baseline.py "$work/tk.model" "$work/corpus.txt" \
        "$work/corpus.tok" "$threads" | sed -n 's/python_mb_per_s //p')
  echo "round $r: anvil $a MB/s, python sentencepiece $p MB/s (same ids; anvil round trip exact)"
  anvil_rates+=("$a") python_rates+=("$p")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ma=$(median "${anvil_rates[@]}") mp=$(median "${python_rates[@]}")
echo "median: anvil $ma MB/s, python $mp MB/s, ratio $(python3 -c "print(f'{$ma / $mp:.2f}')")x"
