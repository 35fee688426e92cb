#!/usr/bin/env bash
# Fuzzes anvil's readers of outside files with libFuzzer under ASan + UBSan:
# safetensors, the checkpoint index, token files, model configs, state.json,
# run files, recipes, tokenizer models and the Hugging Face sharded index
# (docs/checkpoints.md). Each harness runs SECONDS (default 600) from the seed corpus
# in fuzz/corpus/<name> (new inputs go to a scratch directory); a crash or
# sanitizer report stops it and leaves the input in fuzz/findings/.
# The test command runs every harness for 30 s; longer runs by hand:
#   fuzz/run.sh [SECONDS=600] [HARNESS...]   (HARNESS: safetensors index tokens config state run recipe tokenizer hf_index)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}; shift || true
harnesses=("$@"); [ ${#harnesses[@]} -gt 0 ] || harnesses=(safetensors index tokens config state run recipe tokenizer hf_index)
command -v clang++ > /dev/null || { echo "fuzz/run.sh: needs clang++ and libclang-rt-dev (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
out=build-fuzz
mkdir -p "$out" fuzz/findings
srcs=(src/anvil/base/files.cpp src/anvil/base/checksum.cpp src/anvil/base/json_text.cpp
      src/anvil/base/options.cpp src/anvil/base/dtype.cpp src/anvil/base/shared_buffer.cpp
      src/anvil/base/progress.cpp
      src/anvil/ckpt/safetensors.cpp src/anvil/ckpt/sharded.cpp src/anvil/ckpt/checkpoint.cpp
      src/anvil/ckpt/hf_files.cpp
      src/anvil/model/params.cpp src/anvil/model/config.cpp
      src/anvil/data/tokens.cpp src/anvil/data/tokenizer.cpp src/anvil/data/tokenizer_json.cpp
      src/anvil/data/batches.cpp src/anvil/train/options.cpp src/anvil/train/recipe_file.cpp
      src/anvil/optim/adamw.cpp src/anvil/optim/square_sum.cpp src/anvil/ft/faults.cpp
      src/anvil/tensor/arena.cpp)
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -fopenmp -Isrc -Ifuzz)
# The readers once (objects reused by every harness; rebuilt when a source is newer).
objs=()
for src in "${srcs[@]}"; do
  obj="$out/$(echo "${src#src/anvil/}" | tr / _ | sed 's/\.cpp$/.o/')"
  if [ ! -f "$obj" ] || [ -n "$(find src fuzz -newer "$obj" -name '*.?pp' | head -1)" ]; then
    echo "== compiling $src" >&2
    clang++ "${flags[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done
for h in "${harnesses[@]}"; do
  if [ ! -x "$out/${h}_fuzz" ] || [ -n "$(find src fuzz -newer "$out/${h}_fuzz" -name '*.?pp' | head -1)" ]; then
    echo "== $h: building" >&2
    clang++ "${flags[@]}" "fuzz/${h}_fuzz.cpp" "${objs[@]}" -lisal $(pkg-config --libs sentencepiece) -o "$out/${h}_fuzz"
  fi
done
# One harness per core at a time; each prints its line when done.
fuzz_one() {
  local h=$1 work found=0 runs
  work=$(mktemp -d)
  if ! "$out/${h}_fuzz" "$work" "fuzz/corpus/$h" -max_total_time="$seconds" -rss_limit_mb=2048 \
      -timeout=10 -artifact_prefix="fuzz/findings/${h}-" -print_final_stats=1 > "$out/$h.log" 2>&1; then
    found=1
    echo "== $h: FINDING (fuzz/findings/, log $out/$h.log)" >&2
    grep -E "ERROR|SUMMARY|runtime error" "$out/$h.log" | head -5 >&2
  fi
  runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$out/$h.log" | grep -oE "[0-9]+$" || echo "?")
  echo "$h: $runs inputs in ${seconds}s, corpus $(ls "$work" | wc -l) new + $(ls "fuzz/corpus/$h" | wc -l) seeds, $([ $found -eq 0 ] && echo "no crash or sanitizer report" || echo "a finding: see above")"
  rm -rf "$work"
  return $found
}
status=0
pids=()
for h in "${harnesses[@]}"; do
  fuzz_one "$h" & pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
