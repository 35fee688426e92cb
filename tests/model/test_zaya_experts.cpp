// ZAYA1's experts on rows grouped by expert: expert j runs SwiGLU with its
// own fc1 / fc2 block on its segment [offsets[j], offsets[j + 1]) only, an
// empty segment included, as the per-row definition says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "anvil/model/zaya_experts.hpp"
#include "support/gradient_check.hpp"

namespace anvil::model {
namespace {

using test_support::random_vector;

TEST(ZayaExperts, EachExpertRunsSwiGluOnItsOwnSegment) {
  const ZayaMoeShape s{.hidden = 6, .expert_ffn = 4};
  const int64_t H = s.hidden, F = s.expert_ffn, E = 3, rows = 5;
  const std::vector<int64_t> offsets = {0, 2, 2, 5};  // expert 1 gets no rows
  auto x = random_vector(rows * H, 1), fc1 = random_vector(E * 2 * F * H, 2),
       fc2 = random_vector(E * H * F, 3);
  std::vector<float> y(rows * H, -1.0f), kept_fc1(rows * 2 * F), act(rows * F);
  const ExpertRows r{E, offsets.data(), x.data(), y.data(), kept_fc1.data(), act.data(), nullptr};
  experts_forward(r, s, {fc1.data(), fc2.data()});
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      std::vector<double> a(F);
      for (int64_t f = 0; f < F; ++f) {
        double gate = 0, up = 0;
        for (int64_t h = 0; h < H; ++h) {
          gate += fc1[(e * 2 * F + f) * H + h] * x[i * H + h];
          up += fc1[(e * 2 * F + F + f) * H + h] * x[i * H + h];
        }
        a[f] = gate / (1 + std::exp(-gate)) * up;
      }
      for (int64_t h = 0; h < H; ++h) {
        double want = 0;
        for (int64_t f = 0; f < F; ++f) want += fc2[(e * H + h) * F + f] * a[f];
        EXPECT_NEAR(y[i * H + h], want, 1e-4) << "expert " << e << ", row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace anvil::model
