// exp, tanh and sigmoid written so that GCC vectorises loops calling them
// (no libm call inside the loop): exp(x) = 2^k * p(r) with r = x - k ln2 in
// [-ln2/2, ln2/2] and p a degree-6 Taylor polynomial, relative error < 2e-7
// over the clamped range. Used by GELU, SiLU, softmax and attention, where
// libm's scalar expf/tanhf measured ~10% of a GPT-2 training step.
// The clamps are float compares: GCC if-converts them, and so vectorises
// the loop, only under -fno-trapping-math (CMakeLists.txt sets it).
// exp, tanh and sigmoid are also device functions (ANVIL_HD): the CUDA
// kernels' GELU and SiLU (kernels/bodies.hpp) and the GEMM epilogues'
// GELU (epilogue.hpp) use the same polynomial. The kernels take them through
// kernels/fast_math.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "anvil/device/gpu_compat.hpp"

// `omp declare simd` for the host compiler only.
#if ANVIL_DEVICE_CODE
#define ANVIL_SIMD_FN
#else
#define ANVIL_SIMD_FN _Pragma("omp declare simd")
#endif

namespace anvil::device {

ANVIL_SIMD_FN
ANVIL_HD inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round to nearest by the 1.5 * 2^23 trick: a plain add the vectoriser
  // keeps in registers (roundf is a libm call unless -ffast-math).
  const float k = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
  // ln2 split in two for an exact k*ln2 subtraction.
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  const float scale = __int_as_float(bits);
#else
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
#endif
  return p * scale;
}

ANVIL_SIMD_FN
ANVIL_HD inline float fast_tanh(float x) {
  const float e = fast_exp(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}

ANVIL_SIMD_FN
ANVIL_HD inline float fast_sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp(-x));
}

#if !ANVIL_DEVICE_CODE
// CPU loops only (not in CUDA translation units): max(init, x[0..n)).
// GCC vectorises no max reduction without -ffinite-math-only (std::max is
// a compare and a select, not an associative op), so the running maxima
// are 16 lanes kept by hand; x86's max is exactly `a > b ? a : b`, which
// the lane loop compiles to.
inline float max_of(const float* x, int64_t n, float init) {
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, init);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = lane[l] > x[j + l] ? lane[l] : x[j + l];
  }
  float mx = init;
  for (int64_t l = 0; l < kLanes; ++l) mx = std::max(mx, lane[l]);
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}
#endif

}  // namespace anvil::device
