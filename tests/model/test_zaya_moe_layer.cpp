// The MoE layer's pieces meet at narrow interfaces, so swapping the token
// dispatcher (what expert parallelism does) changes where the experts' rows
// live and nothing that is computed: with a dispatcher that copies every
// row through buffers of its own, the output, the router state, the token
// counts and every gradient are bit-identical to the local dispatcher's.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/model/carver.hpp"
#include "anvil/model/zaya_moe_layer.hpp"
#include "support/copying_dispatcher.hpp"
#include "support/gradient_check.hpp"

namespace anvil::model {
namespace {

using test_support::random_vector;

// A layer's weights or gradients, as ZayaMoeParams over vectors.
struct Tensors {
  std::vector<std::vector<float>> v;
  ZayaMoeParams params() {
    return {{v[0].data(), v[1].data(), v[2].data(), v[3].data(), v[4].data(), v[5].data(),
             v[6].data(), v[7].data(), v[8].data()},
            {v[9].data(), v[10].data()}};
  }
};

struct LayerRun {
  std::vector<float> out, rstate, dx, drstate_prev;
  std::vector<int32_t> choices;
  std::vector<int64_t> tokens_per_class;
  Tensors grads;
};

LayerRun run(ZayaMoeLayer& layer, const ZayaMoeShape& s, int64_t N, Tensors weights) {
  const int64_t H = s.hidden, R = s.router_dim;
  const auto x = random_vector(N * H, 1), rprev = random_vector(N * R, 2);
  const auto dout = random_vector(N * H, 3), drstate = random_vector(N * R, 4);
  const std::vector<float> bias = {0.05f, 0.0f, -0.05f, 0.1f, 0.4f};  // the last is skip
  LayerRun r{std::vector<float>(N * H),
             std::vector<float>(N * R),
             std::vector<float>(N * H),
             std::vector<float>(N * R),
             {},
             {},
             {}};
  for (const auto& w : weights.v) r.grads.v.emplace_back(w.size(), 0.0f);
  layer.forward(r.out.data(), r.rstate.data(), x.data(), rprev.data(), weights.params(),
                bias.data());
  layer.backward(r.dx.data(), r.drstate_prev.data(), r.grads.params(), dout.data(), drstate.data(),
                 x.data(), rprev.data(), weights.params(), 0.5f);
  r.choices.assign(layer.choices().begin(), layer.choices().end());
  r.tokens_per_class = layer.stats().tokens_per_class;
  return r;
}

TEST(ZayaMoeLayer, SwappingTheDispatcherChangesNothingThatIsComputed) {
  const ZayaMoeShape s{.hidden = 12, .router_dim = 8, .experts = 4, .expert_ffn = 6, .top_k = 2};
  const int64_t N = 37, H = s.hidden, R = s.router_dim, E = s.experts, F = s.expert_ffn;
  const RouterLossCoefs losses{0.3f, 0.05f};
  Tensors w;
  uint32_t seed = 10;
  for (int64_t n : {R * H, R, R, R, R * R, R, R * R, R, (E + 1) * R, E * 2 * F * H, E * H * F}) {
    w.v.push_back(random_vector(static_cast<size_t>(n), seed++, 0.5f));
  }
  ZayaMoeLayer local(s, N, losses);
  ZayaMoeLayer copying(s, N, losses, std::make_unique<::test_support::CopyingDispatcher>(s, N));
  ZayaMoeLayer::Scratch scratch{};
  const tensor::Arena arena = carve_arena("test", [&](Carver& c) {
    scratch.carve(c, s, N);
    copying.carve(c, scratch);
  });
  const LayerRun want = run(local, s, N, w), got = run(copying, s, N, w);
  int64_t skips = want.tokens_per_class[E];
  EXPECT_GT(skips, 0);
  EXPECT_LT(skips, N * s.top_k);
  EXPECT_EQ(got.choices, want.choices);
  EXPECT_EQ(got.tokens_per_class, want.tokens_per_class);
  EXPECT_EQ(got.out, want.out);
  EXPECT_EQ(got.rstate, want.rstate);
  EXPECT_EQ(got.dx, want.dx);
  EXPECT_EQ(got.drstate_prev, want.drstate_prev);
  for (size_t i = 0; i < w.v.size(); ++i) EXPECT_EQ(got.grads.v[i], want.grads.v[i]) << i;
}

}  // namespace
}  // namespace anvil::model
