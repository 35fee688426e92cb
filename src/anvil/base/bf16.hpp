// bfloat16 storage: the top 16 bits of an IEEE float. Conversions round to
// nearest even (as hardware VCVTNEPS2BF16 does) and keep NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace anvil {

struct bf16 {
  uint16_t bits = 0;
};

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

#if defined(__AVX512BF16__) && !defined(__CUDACC__)
// The lanes of `x` holding a subnormal float. VCVTNEPS2BF16 reads those as
// zero whatever MXCSR says, where to_bf16(float) rounds them as any other
// value (as PyTorch and CUDA's __float2bfloat16_rn do): a block holding one
// is converted by the scalar rounding, so every path gives the same bits.
inline __mmask16 subnormal_lanes(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  return static_cast<__mmask16>(_mm512_test_epi32_mask(b, _mm512_set1_epi32(0x007fffff)) &
                                ~_mm512_test_epi32_mask(b, _mm512_set1_epi32(0x7f800000)));
}
#endif

// dst[0, n) = to_bf16(src[0, n)) on the calling thread, 16 at a time by
// AVX512_BF16's VCVTNEPS2BF16 where the build targets it (the same bits).
inline void to_bf16(bf16* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__) && !defined(__CUDACC__)
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    if (subnormal_lanes(x) != 0) {
      for (int64_t j = i; j < i + 16; ++j) dst[j] = to_bf16(src[j]);
      continue;
    }
    const __m256bh v = _mm512_cvtneps_pbh(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(v));
  }
#endif
  for (; i < n; ++i) dst[i] = to_bf16(src[i]);
}

inline float to_float(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace anvil
