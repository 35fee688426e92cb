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
# Where the CUDA toolkit is (the build compiles the GPU backends there), pip
# fetches the cuDNN frontend's headers below.
cuda=0
{ command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } && cuda=1
[ "$cuda" = 1 ] && packages+=(python3-pip)

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
# The GPU build's header-only dependency: cuDNN's frontend (the C++ graph
# API over cuDNN's fused flash attention), from its PyPI wheel, pinned by
# version and hash, unpacked into .deps/ where CMake looks for it.
if [ "$cuda" = 1 ]; then
  fe_version=1.32.0
  fe_wheel=nvidia_cudnn_frontend-$fe_version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  fe_sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
  fe_dir=.deps/cudnn-frontend-$fe_version
  if [ ! -f "$fe_dir/include/cudnn_frontend.h" ]; then
    echo "cuDNN frontend $fe_version: fetching its headers into $fe_dir" >&2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps \
      --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
      -d "$tmp" "nvidia-cudnn-frontend==$fe_version"
    echo "$fe_sha256  $tmp/$fe_wheel" | sha256sum -c --quiet -
    rm -rf "$fe_dir.partial"
    /usr/bin/python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' \
      "$tmp/$fe_wheel" "$fe_dir.partial"
    mv "$fe_dir.partial" "$fe_dir"
  fi
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
