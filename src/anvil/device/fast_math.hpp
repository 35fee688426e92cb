// exp, tanh, sigmoid and the normal CDF written so that GCC vectorises loops calling them
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

// The standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2, for the exact
// GELU x Phi(x) (the ZAYA1 router's), without libm's scalar erf:
// erfc(z) = t exp(P(t) - z^2), t = 1 / (1 + z / 2), z = |x| / sqrt 2, with
// P a degree-9 polynomial fitted by least squares on Chebyshev nodes of z in
// [0, 10] to log(erfc(z) / t) + z^2 (within 5e-8). Phi(-|x|) is that
// erfc's half, so the result keeps its relative accuracy in the lower tail,
// where 1 + erf(x) loses its digits: within 6e-7 relative for |x| <= 2,
// and within the float rounding of z^2 beyond (2e-6 at |x| = 5, 2e-5 at 12;
// tests/kernels/test_bodies.cpp).
ANVIL_SIMD_FN
ANVIL_HD inline float fast_normal_cdf(float x) {
  const float z = (x < 0.0f ? -x : x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.144930214f;
  p = p * t - 0.680827178f;
  p = p * t + 1.15673376f;
  p = p * t - 0.6962519f;
  p = p * t - 0.0802804311f;
  p = p * t + 0.00126758567f;
  p = p * t + 0.0346028003f;
  p = p * t + 0.386640412f;
  p = p * t + 0.998632783f;
  p = p * t - 1.265448f;
  const float lower = 0.5f * t * fast_exp(p - z * z);  // Phi(-|x|)
  return x < 0.0f ? lower : 1.0f - lower;
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
