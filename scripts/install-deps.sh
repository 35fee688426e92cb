#!/usr/bin/env bash
# Installs the Debian packages anvil builds and runs with, if any is missing.
# With --tests, also what the test suite needs: GoogleTest, the reference
# implementations the tests compare with (Debian's PyTorch and SentencePiece
# bindings), network namespaces for the two-host test, gnuplot for the plot
# test, and the project's Python environment (.venv, from the pinned
# requirements.txt: transformers, TensorBoard, lm-eval as test clients).
# Safe to run again: it does nothing when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
[ "${1:-}" = "--tests" ] && tests=1

packages=(
  build-essential cmake
  pkgconf                  # finds sentencepiece for CMake
  libopenblas-openmp-dev   # GEMM (fp32); anvil dlopen()s it to pick the kernels
  libdnnl-dev              # oneDNN: bf16 GEMM (AVX512_BF16)
  ocl-icd-opencl-dev       # Debian's dnnl-config.cmake calls find_package(OpenCL REQUIRED); libdnnl-dev only recommends it
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev
  libisal-dev              # Intel ISA-L: CRC-32 of checkpoint shards
  libsentencepiece-dev     # anvil data tokenizer / tokenize: SentencePiece BPE and unigram
  bible-kjv                # public-domain English text for the quick start's training run (`bible` prints it)
)
test_packages=(
  libgtest-dev
  iproute2                 # ip netns / veth / tc tbf: the multi-host test's hosts and link
  python3-torch            # the PyTorch reference in the parity tests and the training baseline
  python3-sentencepiece    # bench/tokenizer.sh: the Python binding, the speed baseline
  gnuplot-nox              # anvil plot renders its PNGs with it (pngcairo)
  fortunes                 # scripts/corpus.sh: English quotations and verse, more prose for the default corpus
  python3-venv             # .venv: the pinned PyPI test clients (requirements.txt)
  python3-dev              # Python.h: torch.compile's C++ code (bench/torch_compare.sh)
  clang libclang-rt-dev    # fuzz/run.sh: libFuzzer with ASan + UBSan (30 s per harness in the test command)
)
[ "$tests" = 1 ] && packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$tests" = 1 ] || exit 0

# The Python environment, rebuilt when requirements.txt changes (its hash
# is kept in .venv/requirements.sha256). Debian's python3, not a user's.
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/requirements.sha256 2>/dev/null)" != "$want" ]; then
  echo "python environment: installing requirements.txt into .venv (about 7 GB, 2 min)" >&2
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want" > .venv/requirements.sha256
fi
