#!/usr/bin/env bash
# Packs what a GPU machine needs to run scripts/gpu-check.sh when it has the
# CUDA toolkit but none of anvil's other dependencies: the anvil and
# anvil_gpu_tests binaries (stripped), every shared library they load that is
# not part of CUDA or the GPU driver (from ldd, glibc and its loader included,
# so the bundle does not depend on the GPU machine's distribution), the
# shipped hardware profiles. xz-compressed; the limit
# is 48 MiB, so that the bundle and the working tree (about 9 MiB) stay
# under 64 MiB, for a GPU host that receives the checkout plus at most that.
#
#   scripts/gpu-bundle.sh [OUT]     default OUT: gpu-bundle/anvil-gpu.tar.xz
#
# The binaries run on another machine's CPU, whose instruction set is not
# this one's: by default they come from build-gpu/, a build for x86-64-v3
# (AVX2 + FMA, which every GPU server's CPU has; -march=native here could
# put AVX-512 in them), configured and brought up to date here (~10 min the
# first time on 2 cores). ANVIL_BUILD_DIR=DIR packs DIR's binaries as they
# are (the CTest does, on the machine that built them).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle/anvil-gpu.tar.xz}
limit=$((48 * 1024 * 1024))
if [[ -n ${ANVIL_BUILD_DIR:-} ]]; then
  build=$ANVIL_BUILD_DIR
  [[ -x $build/anvil && -x $build/tests/anvil_gpu_tests ]] ||
    { echo "gpu-bundle: no anvil and anvil_gpu_tests in $build" >&2; exit 2; }
else
  build=build-gpu
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DANVIL_MARCH=x86-64-v3 -DANVIL_CUDA=on \
    -DANVIL_BUILD_TESTS=ON >/dev/null
  cmake --build "$build" -j "$(nproc)" --target anvil anvil_gpu_tests
fi
# The whole output first: grep -q stops reading at its match, and a writer
# still writing would die of SIGPIPE and fail the pipeline.
if ! grep -q '"cuda_built": true' <<< "$("$build/anvil" hw --json)"; then
  echo "gpu-bundle: $build/anvil was built without CUDA; rebuild with -DANVIL_CUDA=on" >&2
  exit 2
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/anvil
mkdir -p "$root/bin" "$root/lib"
strip --strip-unneeded -o "$root/bin/anvil" "$build/anvil"
strip --strip-unneeded -o "$root/bin/anvil_gpu_tests" "$build/tests/anvil_gpu_tests"
# The GPU machine brings its own CUDA: runtime pieces, cuBLAS(Lt), NCCL,
# cuDNN and the driver's libraries are never packed.
cuda_own='libcuda\.|libcudart|libcublas|libnccl|libcudnn|libnvidia|libnvrtc|linux-vdso'
# OpenBLAS is dlopen()ed (device/blas.cpp), so ldd of the binaries misses it:
# the OpenMP build and what it loads go in too, found as libopenblas.so.0.
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
cp -L "$blas" "$root/lib/libopenblas.so.0"
ldd "$build/anvil" "$build/tests/anvil_gpu_tests" "$blas" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}' |
  sort -u | grep -Ev "$cuda_own" | while read -r lib; do
    cp -L "$lib" "$root/lib/"
  done
# The rest of this glibc too: CUDA's and the driver's libraries, loaded at
# run time, need libdl, libpthread and librt, which would otherwise come from
# the GPU machine's glibc, whose private symbols need its own libc, not ours.
for lib in libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libresolv.so.2; do
  if [[ -e /lib/x86_64-linux-gnu/$lib && ! -e $root/lib/$lib ]]; then
    cp -L "/lib/x86_64-linux-gnu/$lib" "$root/lib/"
  fi
done
cp -r profiles "$root/profiles"
# The commit the binaries were built from (the check writes it down) and
# the hash of their sources (the check refuses a bundle of other sources).
git describe --always --dirty > "$root/SOURCE" 2>/dev/null || echo unknown > "$root/SOURCE"
scripts/source-hash.sh > "$root/SOURCE_HASH"
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - anvil | xz -T2 -9 > "$out.tmp"
size=$(stat -c %s "$out.tmp")
if ((size > limit)); then
  rm -f "$out.tmp"
  echo "gpu-bundle: $((size / 1048576)) MiB is over the 48 MiB limit" >&2
  exit 1
fi
mv "$out.tmp" "$out"
echo "gpu-bundle: $out, $((size / 1048576)) MiB ($size bytes), $(ls "$root/lib" | wc -l) libraries:"
ls "$root/lib" | tr '\n' ' '
echo
