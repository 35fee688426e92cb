// bfloat16 storage: the top 16 bits of an IEEE float. Conversions round to
// nearest even (as hardware VCVTNEPS2BF16 does) and keep NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>

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

inline float to_float(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace anvil
