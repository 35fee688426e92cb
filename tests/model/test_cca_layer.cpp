// The whole CCA layer's backward against finite differences of its forward,
// for the input and every parameter (docs/zaya1-spec.md section 3).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/model/cca_layer.hpp"
#include "support/gradient_check.hpp"

namespace anvil::model {
namespace {

TEST(CcaLayer, BackwardMatchesFiniteDifferencesForInputAndEveryParameter) {
  CcaShape s;
  s.hidden = 12;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.rotary_dim = 4;
  const int64_t B = 2, S = 5, N = B * S, H = s.hidden, C = s.channels(), d = s.head_dim;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(gen);
    return v;
  };
  std::vector<std::vector<float>> w = {random(C * H), random(d * H), random(d * H),
                                       random(C * 2), random(C),     random(C * d * 2),
                                       random(C),     random(2),     random(H * s.q_latent())};
  std::vector<std::vector<float>> gw;
  for (const auto& v : w) gw.emplace_back(v.size(), 0.0f);
  auto params = [](std::vector<std::vector<float>>& v) {
    return CcaParams{v[0].data(), v[1].data(), v[2].data(), v[3].data(), v[4].data(),
                     v[5].data(), v[6].data(), v[7].data(), v[8].data()};
  };
  auto x = random(N * H);
  const auto r = random(N * H);
  CcaLayer layer(s, B, S);
  layer.allocate();
  std::vector<float> out(N * H);
  auto objective = [&] {
    layer.forward(out.data(), x.data(), params(w));
    double sum = 0;
    for (int64_t i = 0; i < N * H; ++i) sum += static_cast<double>(out[i]) * r[i];
    return sum;
  };
  objective();
  std::vector<float> dx(N * H);
  layer.backward(dx.data(), params(gw), r.data(), x.data(), params(w));
  auto check = [&](const char* what, std::vector<float>& v, const std::vector<float>& g) {
    test_support::expect_matches_finite_differences(what, v, g, objective, 1e-2f, 3e-2, 60);
  };
  check("dx", x, dx);
  const char* names[] = {"wqk",     "wv1",     "wv2",  "conv0_w", "conv0_b",
                         "conv1_w", "conv1_b", "temp", "wo"};
  for (size_t i = 0; i < w.size(); ++i) check(names[i], w[i], gw[i]);
}

TEST(CcaLayer, NeedsTwoKeyValueHeads) {
  CcaShape s;
  s.kv_heads = 4;
  EXPECT_THROW(CcaLayer(s, 1, 4), InputError);
}

}  // namespace
}  // namespace anvil::model
