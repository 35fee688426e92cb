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

// dst[0, n) = to_bf16(src[0, n)) on the calling thread, 16 at a time by
// AVX512_BF16's VCVTNEPS2BF16 where the build targets it.
inline void to_bf16(bf16* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__) && !defined(__CUDACC__)
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
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
