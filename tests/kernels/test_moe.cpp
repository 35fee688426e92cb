// Dropless MoE plumbing: dispatch is a stable sort that drops nothing; a
// whole MoE layer (dispatch, gather, per-expert linear on each segment,
// combine) equals the per-token definition and its gradients match finite
// differences, for top-1 and top-2 with skip choices.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/moe.hpp"
#include "support/gradient_check.hpp"

namespace anvil::kernels {
namespace {

using test_support::random_vector;

std::vector<int32_t> random_choices(size_t n, int32_t classes, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> c(n);
  for (auto& x : c) x = static_cast<int32_t>(gen() % classes);
  return c;
}

TEST(Moe, DispatchIsAStableSortThatDropsNothing) {
  const int64_t N = 97, k = 2, E = 5;
  const auto choice = random_choices(N * k, E + 1, 1);  // E = skip
  std::vector<int32_t> order(N * k), slot(N * k);
  std::vector<int64_t> offsets(E + 1);
  const int64_t rows =
      moe_dispatch(order.data(), offsets.data(), slot.data(), choice.data(), N, k, E);
  int64_t skips = 0;
  for (int32_t c : choice) skips += c == E;
  EXPECT_EQ(rows, N * k - skips);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      EXPECT_EQ(choice[order[i]], e);
      if (i > offsets[e]) {
        EXPECT_LT(order[i - 1], order[i]);  // stable
      }
      EXPECT_EQ(slot[order[i]], i);
    }
  }
  for (int64_t a = 0; a < N * k; ++a) EXPECT_EQ(slot[a] < 0, choice[a] == E);
}

struct MoeCase {
  int64_t N, C, E, k;
  bool skip_identity;
};

class MoeLayer : public testing::TestWithParam<MoeCase> {};

TEST_P(MoeLayer, EqualsThePerTokenDefinitionAndMatchesFiniteDifferences) {
  const auto [N, C, E, k, skip_identity] = GetParam();
  auto x = random_vector(N * C, 1), gate = random_vector(N * k, 2), w = random_vector(E * C * C, 3);
  const auto choice = random_choices(N * k, static_cast<int32_t>(E + 1), 4);
  const auto r = random_vector(N * C, 5);
  std::vector<int32_t> order(N * k), slot(N * k);
  std::vector<int64_t> offsets(E + 1);
  const int64_t rows =
      moe_dispatch(order.data(), offsets.data(), slot.data(), choice.data(), N, k, E);
  std::vector<float> xs(rows * C), ys(rows * C), out(N * C);
  auto layer = [&] {
    moe_gather(xs.data(), x.data(), order.data(), rows, k, C);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = offsets[e + 1] - offsets[e];
      if (n > 0) {
        linear_forward(ys.data() + offsets[e] * C, xs.data() + offsets[e] * C, w.data() + e * C * C,
                       nullptr, n, C, C);
      }
    }
    moe_combine_forward(out.data(), ys.data(), x.data(), gate.data(), slot.data(), skip_identity, N,
                        k, C);
    double s = 0;
    for (int64_t i = 0; i < N * C; ++i) s += static_cast<double>(out[i]) * r[i];
    return s;
  };
  layer();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = choice[n * k + j];
        double y = 0;
        if (e == E) {
          y = skip_identity ? x[n * C + c] : 0.0;
        } else {
          for (int64_t i = 0; i < C; ++i) y += w[(e * C + c) * C + i] * x[n * C + i];
        }
        want += gate[n * k + j] * y;
      }
      EXPECT_NEAR(out[n * C + c], want, 1e-4);
    }
  }
  // Backward.
  std::vector<float> dys(rows * C), dxs(rows * C), dx(N * C), dgate(N * k), dw(E * C * C);
  moe_combine_backward(dys.data(), dgate.data(), dx.data(), r.data(), ys.data(), x.data(),
                       gate.data(), slot.data(), skip_identity, N, k, C);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n > 0) {
      linear_backward(dxs.data() + offsets[e] * C, dw.data() + e * C * C, nullptr,
                      dys.data() + offsets[e] * C, xs.data() + offsets[e] * C, w.data() + e * C * C,
                      n, C, C);
    }
  }
  moe_gather_backward(dx.data(), dxs.data(), slot.data(), N, k, C);
  auto check = [&](const char* what, std::vector<float>& v, const std::vector<float>& g) {
    test_support::expect_matches_finite_differences(what, v, g, layer, 1e-2f, 1e-2, v.size());
  };
  check("dx", x, dx);
  check("dgate", gate, dgate);
  check("dw", w, dw);
}

INSTANTIATE_TEST_SUITE_P(TopKAndSkip, MoeLayer,
                         testing::Values(MoeCase{23, 6, 4, 1, true}, MoeCase{17, 5, 3, 2, true},
                                         MoeCase{19, 4, 5, 1, false}));

}  // namespace
}  // namespace anvil::kernels
