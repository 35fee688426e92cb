// Shared by the layer tests: random inputs, the sum(out * R) objective whose
// gradient with respect to `out` is R, and the central finite-difference
// check of an analytic gradient.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

namespace anvil::test_support {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * r[i];
  return s;
}

// Checks grad[i] against the central difference
// (L(x + h e_i) - L(x - h e_i)) / 2h at up to `max_points` evenly strided
// indices. Each point's error is bounded relative to its own numeric
// gradient: |numeric - analytic| <= tol * (|numeric| + floor), with
// floor = floor_fraction * max |numeric| over the points (plus 1e-6), so a
// term missing from a gradient fails even where it is small next to the
// largest entries; the floor only absorbs finite-difference noise on entries
// that are (near) zero.
inline void expect_matches_finite_differences(const char* what, std::vector<float>& x,
                                              const std::vector<float>& grad,
                                              const std::function<double()>& objective,
                                              float h = 1e-2f, double tol = 2e-2,
                                              size_t max_points = 200,
                                              double floor_fraction = 1e-2) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const size_t stride = std::max<size_t>(1, x.size() / max_points);
  std::vector<std::pair<size_t, double>> numeric;
  double max_numeric = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = objective();
    x[i] = saved - h;
    const double down = objective();
    x[i] = saved;
    numeric.push_back({i, (up - down) / (2.0 * h)});
    max_numeric = std::max(max_numeric, std::abs(numeric.back().second));
  }
  const double floor = floor_fraction * max_numeric + 1e-6;
  double worst = 0;  // largest error / allowed
  size_t worst_i = 0;
  double worst_num = 0;
  for (const auto& [i, num] : numeric) {
    const double ratio = std::abs(num - grad[i]) / (tol * (std::abs(num) + floor));
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
      worst_num = num;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": at index " << worst_i << " numeric " << worst_num
                        << " analytic " << grad[worst_i] << " (allowed " << tol
                        << " x (|numeric| + " << floor << "); max |numeric| " << max_numeric << ")";
}

}  // namespace anvil::test_support
