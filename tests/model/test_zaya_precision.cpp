// ZAYA1 with bf16 matrix multiplies (--precision bf16): the CCA projections
// and the experts run on bf16 copies of their weights and inputs with fp32
// accumulation; everything else stays fp32. Against the fp32 model on the
// same weights and tokens: the same routing, the loss and every gradient
// close at bf16's resolution (8 mantissa bits), and not identical.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/model/zaya_model.hpp"
#include "support/zaya_setup.hpp"

namespace anvil::model {
namespace {

TEST(ZayaPrecision, Bf16GradientsMatchFp32AtBf16Resolution) {
  const auto config = load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
  const int64_t B = 2, T = config.seq_len, N = B * T;
  ZayaModel fp32(config, B, T), bf16(config, B, T, {}, {}, Precision::bf16);
  test_support::move_away_from_init(fp32, 5);
  std::copy(fp32.params(), fp32.params() + fp32.registry().total(), bf16.params());
  const auto [tokens, targets] = test_support::random_batch(config.vocab_size, N, 4);
  int64_t scored = 0;
  fp32.zero_grads();
  bf16.zero_grads();
  const double want = fp32.forward_backward(tokens.data(), targets.data(), 1.0f / N, &scored);
  const double got = bf16.forward_backward(tokens.data(), targets.data(), 1.0f / N, &scored);
  EXPECT_NEAR(got, want, 5e-3 * std::abs(want));
  EXPECT_NE(got, want);
  for (int64_t m = 0; m < static_cast<int64_t>(fp32.balancing_biases().size()); ++m) {
    const auto got_choices = bf16.moe_layer(m).choices(),
               want_choices = fp32.moe_layer(m).choices();
    ASSERT_EQ(std::vector<int32_t>(got_choices.begin(), got_choices.end()),
              std::vector<int32_t>(want_choices.begin(), want_choices.end()))
        << "MoE layer " << m;
  }
  // Each tensor's gradient within 3% in norm (bf16 rounds each input to
  // ~0.4%, and the errors of a layer's GEMMs add up through backward).
  double worst = 0;
  for (const auto& s : fp32.registry().specs()) {
    double diff = 0, norm = 1e-30;
    for (int64_t i = 0; i < s.numel; ++i) {
      const double a = fp32.grads()[s.offset + i], b = bf16.grads()[s.offset + i];
      diff += (a - b) * (a - b);
      norm += a * a;
    }
    if (norm < 1e-20) continue;  // an exactly-zero gradient (the key bias)
    const double rel = std::sqrt(diff / norm);
    EXPECT_LT(rel, 3e-2) << s.name;
    worst = std::max(worst, rel);
  }
  EXPECT_GT(worst, 1e-5);  // the multiplies did run in bf16
  // Weights handed out again (an optimizer step) are copied again.
  bf16.params()[bf16.registry().get("model.layers.0.self_attn.o_proj.weight").offset] += 1.0f;
  const double moved = bf16.forward(tokens.data(), targets.data(), &scored);
  EXPECT_NE(moved, got);
}

// The bf16 weight copy an optimizer may rewrite with its update (AdamW's
// params_bf16): offered only while it matches the weights, so from the
// forward that converted them until params() hands them out for writing;
// after bf16_weights_refreshed() the next forward uses it as it is.
TEST(ZayaPrecision, Bf16CopyIsOfferedOnlyWhileItMatchesTheWeights) {
  const auto config = load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
  const int64_t B = 2, T = config.seq_len, N = B * T;
  ZayaModel fp32(config, B, T), mixed(config, B, T, {}, {}, Precision::bf16);
  const auto [tokens, targets] = test_support::random_batch(config.vocab_size, N, 4);
  int64_t scored = 0;
  EXPECT_EQ(fp32.fresh_bf16_weights(), nullptr);
  EXPECT_EQ(mixed.fresh_bf16_weights(), nullptr);  // not converted yet
  mixed.zero_grads();
  mixed.forward_backward(tokens.data(), targets.data(), 1.0f / N, &scored);
  bf16* low = mixed.fresh_bf16_weights();
  ASSERT_NE(low, nullptr);
  float* p = mixed.params();
  EXPECT_EQ(mixed.fresh_bf16_weights(), nullptr);
  // A writer that keeps the copy in step: the next forward converts nothing,
  // so the copy it multiplies is the one written here.
  p[0] += 1.0f;
  low[0] = to_bf16(p[0]);
  mixed.bf16_weights_refreshed();
  EXPECT_EQ(mixed.fresh_bf16_weights(), low);
  low[1] = to_bf16(12345.0f);  // not the weight: shows the forward left the copy alone
  mixed.forward(tokens.data(), targets.data(), B, T, &scored);
  EXPECT_EQ(low[1].bits, to_bf16(12345.0f).bits);
}

}  // namespace
}  // namespace anvil::model
