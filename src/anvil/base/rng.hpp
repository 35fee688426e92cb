// Counter-based random numbers: a value depends only on (seed, stream, index),
// never on how many numbers were drawn before. Parameter init keyed by a
// parameter's name and data order keyed by the step are therefore the same
// whatever the rank layout or the point a run was resumed from.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace anvil {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a: a stable stream id from a name.
inline uint64_t stream_id(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

inline uint64_t random_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
}

// Uniform in (0, 1): never 0, so log() is safe.
inline double random_unit(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(random_u64(seed, stream, index) >> 11) + 0.5) * 0x1.0p-53;
}

// A standard normal by Box-Muller from two uniforms in (0, 1); a stream's
// i-th normal takes its draws 2i and 2i + 1 (model/params.cpp).
inline double box_muller(double u1, double u2) {
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace anvil
