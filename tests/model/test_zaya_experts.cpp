// ZAYA1's experts on rows grouped by expert: expert j runs SwiGLU with its
// own fc1 / fc2 block on its segment [offsets[j], offsets[j + 1]) only, an
// empty segment included, as the per-row definition says.
#include <gtest/gtest.h>

#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "anvil/base/bf16.hpp"

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

// One forward and backward of E experts over uneven segments (an empty one
// included) on `threads` threads: their outputs, input gradient and weight
// gradients, back to back. The backward's buffers start out holding `fill`.
std::vector<float> experts_pass(int threads, bool half, float fill = 0.0f) {
  const ZayaMoeShape s{.hidden = 48, .expert_ffn = 32};
  const int64_t H = s.hidden, F = s.expert_ffn, E = 5;
  const std::vector<int64_t> offsets = {0, 37, 37, 40, 101, 130};
  const int64_t rows = offsets.back();
  auto x = random_vector(rows * H, 4), dy = random_vector(rows * H, 5);
  auto w = random_vector(E * 3 * F * H, 6);  // fc1 blocks, then fc2 blocks
  std::vector<float> g(w.size(), fill);
  std::vector<bf16> w_low(w.size());
  for (size_t i = 0; i < w.size(); ++i) w_low[i] = to_bf16(w[i]);
  const kernels::Bf16Weights low{w.data(), w_low.data()};
  const int64_t scratch_elems = experts_bf16_scratch(s, rows);
  std::vector<bf16> sa(scratch_elems), sb(scratch_elems);
  kernels::Bf16Scratch scratch{sa.data(), sb.data(), scratch_elems};
  std::vector<float> y(rows * H), kept(rows * 2 * F), act(rows * F), dx(rows * H, fill),
      dfc1(rows * 2 * F, fill), dact(rows * F, fill);
  const ExpertRows r{E,          offsets.data(),           x.data(), y.data(), kept.data(),
                     act.data(), half ? &scratch : nullptr};
  const ZayaExpertParams p{w.data(), w.data() + E * 2 * F * H};
  const ZayaExpertParams grads{g.data(), g.data() + E * 2 * F * H};
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  experts_forward(r, s, p, half ? &low : nullptr);
  experts_backward({dy.data(), dx.data(), dfc1.data(), dact.data()}, r, s, grads, p,
                   half ? &low : nullptr);
  omp_set_num_threads(before);
  std::vector<float> out;
  for (const auto* part : {&y, &dx, &g})
    for (float v : *part) out.push_back(v);
  return out;
}

// With several threads each expert runs on one of them (its own rows, its
// own slice of the bf16 scratch, its own weights' gradients): the same
// numbers as one thread running them in turn.
TEST(ZayaExperts, OnePerThreadMatchesOneThreadInTurnFp32AndBf16) {
  for (bool half : {false, true}) {
    const auto one = experts_pass(1, half), several = experts_pass(4, half);
    ASSERT_EQ(one.size(), several.size());
    double largest = 0, worst = 0;
    for (size_t i = 0; i < one.size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(one[i])));
      worst = std::max(worst, std::abs(static_cast<double>(one[i]) - several[i]));
    }
    EXPECT_LE(worst, 1e-6 * largest) << (half ? "bf16" : "fp32");
    EXPECT_GT(largest, 0.0);
  }
}

// The backward writes its gradients (the input's, the scratch's and every
// expert's weights', zeros for the expert without rows) over what the
// buffers held: nothing need be zeroed first, and the bits are those of
// adding to zeros.
TEST(ZayaExperts, BackwardWritesOverWhatItsBuffersHeld) {
  for (bool half : {false, true}) {
    const auto zeros = experts_pass(1, half), garbage = experts_pass(1, half, std::nanf(""));
    ASSERT_EQ(zeros.size(), garbage.size());
    for (size_t i = 0; i < zeros.size(); ++i)
      ASSERT_EQ(zeros[i], garbage[i]) << (half ? "bf16" : "fp32") << ", value " << i;
  }
}

}  // namespace
}  // namespace anvil::model
