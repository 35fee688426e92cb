#!/usr/bin/env bash
# Installs the Debian packages anvil builds and runs with, if any is missing.
# Safe to run again: it does nothing when everything is there.
set -euo pipefail

packages=(
  build-essential cmake
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
  python3-sentencepiece    # bench/kjv_bpe.py: the BPE vocabulary of the ZAYA1 balance runs
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
