// The ZAYA1 router counts what it chose: the tokens of every class, the
// skip class included, summing to N x k, from the same choices the layer
// dispatches (the balancing controller and the Switch loss read them).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "anvil/model/carver.hpp"
#include "anvil/model/zaya_router.hpp"
#include "support/gradient_check.hpp"

namespace anvil::model {
namespace {

using test_support::random_vector;

TEST(ZayaRouter, CountsTheTokensOfEveryClassSkipIncluded) {
  const ZayaMoeShape s{.hidden = 10, .router_dim = 6, .experts = 5, .top_k = 2};
  const int64_t N = 50, H = s.hidden, R = s.router_dim, K = s.experts + 1;
  ZayaRouter router(s, N, {});
  ZayaRouter::Scratch scratch{};
  const tensor::Arena arena = carve_arena("test", [&](Carver& c) {
    scratch.carve(c, s, N);
    router.carve(c, scratch);
  });
  std::vector<std::vector<float>> w;
  uint32_t seed = 1;
  for (int64_t n : {R * H, R, R, R, R * R, R, R * R, R, K * R}) {
    w.push_back(random_vector(static_cast<size_t>(n), seed++, 0.7f));
  }
  const ZayaRouterParams p{w[0].data(), w[1].data(), nullptr,     w[3].data(), w[4].data(),
                           w[5].data(), w[6].data(), w[7].data(), w[8].data()};
  const auto x = random_vector(N * H, 20);
  std::vector<float> rstate(N * R);
  const std::vector<float> bias = {0.0f, 0.02f, -0.02f, 0.01f, 0.0f, 0.15f};  // skip last
  router.forward(rstate.data(), x.data(), nullptr, p, bias.data());

  std::vector<int64_t> want(K, 0);
  for (int32_t c : router.choices()) ++want[c];
  EXPECT_EQ(router.choices().size(), static_cast<size_t>(N * s.top_k));
  EXPECT_EQ(router.stats().tokens_per_class, want);
  EXPECT_GT(want[K - 1], 0) << "no token took the skip class";
  int64_t total = 0;
  for (int64_t n : router.stats().tokens_per_class) total += n;
  EXPECT_EQ(total, N * s.top_k);
}

}  // namespace
}  // namespace anvil::model
