#include "anvil/optim/square_sum.hpp"

#include <omp.h>

#include <cmath>
#include <limits>

#include "anvil/kernels/bodies.hpp"

namespace anvil::optim {

namespace {

using u128 = unsigned __int128;

constexpr int64_t kLimbBits = 42;
constexpr int64_t kLimbMask = (int64_t{1} << kLimbBits) - 1;
// Squares summed in a uint64 before it could overflow: 2^10 x 2^52 < 2^64.
constexpr int64_t kBlock = 1024;

SquareSum to_limbs(u128 v) {
  SquareSum s;
  for (auto& l : s.limbs) {
    l = static_cast<int64_t>(v & static_cast<u128>(kLimbMask));
    v >>= kLimbBits;
  }
  return s;
}

}  // namespace

float max_abs(const float* grads, int64_t n) {
  float m = 0.0f, probe = 0.0f;  // probe turns NaN on a NaN or an infinity
#pragma omp parallel for simd reduction(max : m) reduction(+ : probe) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, std::fabs(grads[i]));
    probe += grads[i] * 0.0f;
  }
  return std::isnan(probe) ? std::numeric_limits<float>::quiet_NaN() : m;
}

int square_scale(float max_abs) {
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs < 2^e, so every square < 2^(2e)
  return 52 - 2 * e;
}

SquareSum scaled_square_sum(const float* grads, int64_t n, int scale) {
  const double s = std::ldexp(1.0, scale);
  u128 total = 0;
#pragma omp parallel
  {
    u128 mine = 0;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t end = std::min(n, b + kBlock);
      uint64_t acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = b; i < end; ++i) acc += kernels::body::fixed_square(grads[i], s);
      mine += acc;
    }
#pragma omp critical
    total += mine;
  }
  return to_limbs(total);
}

MaxAndSquareSum max_and_square_sum(const float* grads, int64_t n, int guess) {
  const double coarse = std::ldexp(1.0, guess - 2), middle = std::ldexp(1.0, guess),
               fine = std::ldexp(1.0, guess + 2);
  u128 totals[3] = {0, 0, 0};
  float m = 0.0f, probe = 0.0f;
#pragma omp parallel reduction(max : m) reduction(+ : probe)
  {
    u128 mine[3] = {0, 0, 0};
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t end = std::min(n, b + kBlock);
      uint64_t a0 = 0, a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a0, a1, a2) reduction(max : m) reduction(+ : probe)
      for (int64_t i = b; i < end; ++i) {
        m = std::max(m, std::fabs(grads[i]));
        probe += grads[i] * 0.0f;
        a0 += kernels::body::fixed_square(grads[i], coarse);
        a1 += kernels::body::fixed_square(grads[i], middle);
        a2 += kernels::body::fixed_square(grads[i], fine);
      }
      mine[0] += a0;
      mine[1] += a1;
      mine[2] += a2;
    }
#pragma omp critical
    for (int i = 0; i < 3; ++i) totals[i] += mine[i];
  }
  MaxAndSquareSum out;
  out.max = std::isnan(probe) ? std::numeric_limits<float>::quiet_NaN() : m;
  out.guess = guess;
  for (int i = 0; i < 3; ++i) out.sums[i] = to_limbs(totals[i]);
  return out;
}

SquareSum square_sum_of_words(uint64_t low, uint64_t high) {
  return to_limbs((static_cast<u128>(high) << kLimbBits) + low);
}

const SquareSum* MaxAndSquareSum::at(int scale) const {
  for (int i = 0; i < 3; ++i)
    if (scale == guess + 2 * (i - 1)) return &sums[i];
  return nullptr;
}

void add(SquareSum& into, const SquareSum& more) {
  for (int i = 0; i < 3; ++i) into.limbs[i] += more.limbs[i];
}

double square_sum_value(const SquareSum& s, int scale) {
  u128 v = 0;
  for (int i = 2; i >= 0; --i) v = (v << kLimbBits) + static_cast<u128>(s.limbs[i]);
  return std::ldexp(static_cast<double>(v), -scale);
}

}  // namespace anvil::optim
