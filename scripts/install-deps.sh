#!/usr/bin/env bash
# Installs the Debian packages anvil builds and runs with, if any is missing,
# and the project's Python environment (.venv, from the pinned
# requirements.txt: transformers, PyTorch 2 ... as test clients), if it is
# missing or requirements.txt changed. Safe to run again: it does nothing
# when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake
  pkgconf                  # finds sentencepiece for CMake
  libopenblas-openmp-dev   # GEMM (fp32); anvil dlopen()s it to pick the kernels
  libdnnl-dev              # oneDNN: bf16 GEMM (AVX512_BF16)
  ocl-icd-opencl-dev       # Debian's dnnl-config.cmake calls find_package(OpenCL REQUIRED); libdnnl-dev only recommends it
  libopenmpi-dev openmpi-bin
  iproute2                 # ip netns / veth / tc tbf: the multi-host test's hosts and link
  nlohmann-json3-dev libcli11-dev
  libisal-dev              # Intel ISA-L: CRC-32 of checkpoint shards
  libgtest-dev
  python3-torch            # the PyTorch reference in the parity tests and the training baseline
  bible-kjv                # public-domain English text for the training demo (`bible` prints it)
  gnuplot-nox              # anvil plot renders its PNGs with it (pngcairo)
  fortunes                 # scripts/corpus.sh: English quotations and verse, more prose for the default corpus
  libsentencepiece-dev     # anvil data tokenizer / tokenize: SentencePiece BPE and unigram
  python3-sentencepiece    # bench/tokenizer.sh: the Python binding, the speed baseline
  python3-venv             # .venv: the pinned PyPI test clients (requirements.txt)
  python3-dev              # Python.h: torch.compile's C++ code (bench/torch_compare.sh)
)

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
