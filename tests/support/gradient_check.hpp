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

// Checks grad[i] against (L(x + h e_i) - L(x - h e_i)) / 2h at up to
// `max_points` evenly strided indices; the error bound is relative to
// max(1, max |grad|).
inline void expect_matches_finite_differences(const char* what, std::vector<float>& x,
                                              const std::vector<float>& grad,
                                              const std::function<double()>& objective,
                                              float h = 1e-2f, double tol = 2e-2,
                                              size_t max_points = 200) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const size_t stride = std::max<size_t>(1, x.size() / max_points);
  double max_err = 0, max_grad = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = objective();
    x[i] = saved - h;
    const double down = objective();
    x[i] = saved;
    max_err = std::max(max_err, std::abs((up - down) / (2.0 * h) - grad[i]));
    max_grad = std::max(max_grad, std::abs(static_cast<double>(grad[i])));
  }
  EXPECT_LE(max_err, tol * std::max(1.0, max_grad))
      << what << ": max |numeric - analytic| " << max_err << " (max |grad| " << max_grad << ")";
}

}  // namespace anvil::test_support
