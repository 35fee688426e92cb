// ZAYA1 decode: one token at a time through the CCA caches (conv taps, the
// previous token's value projection, the KV cache) gives the full forward's
// logits, including tokens routed to every expert and to the skip class.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/base/rng.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/zaya_model.hpp"
#include "support/zaya_setup.hpp"

namespace anvil::model {
namespace {

void check_decode_equals_prefill(int64_t top_k) {
  auto config = load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
  config.top_k = top_k;
  const int64_t T = config.seq_len;
  ZayaModel prefill(config, 1, T);
  test_support::move_away_from_init(prefill, 9);
  std::vector<int32_t> tokens(T), targets(T, -1);
  for (int64_t i = 0; i < T; ++i)
    tokens[i] = static_cast<int32_t>(random_u64(3, 1, i) % config.vocab_size);
  test_support::spread_choices(prefill, tokens, targets);
  int64_t scored = 0;
  prefill.forward(tokens.data(), targets.data(), &scored);
  std::set<int32_t> chosen;
  for (size_t m = 0; m < prefill.balancing_biases().size(); ++m) {
    const auto& c = prefill.moe_layer(static_cast<int64_t>(m)).choices();
    chosen.insert(c.begin(), c.end());
  }
  EXPECT_TRUE(chosen.count(static_cast<int32_t>(config.n_experts))) << "no token took the skip";
  EXPECT_GE(chosen.size(), 3u);
  const int64_t V = config.vocab_size;
  std::vector<float> want(T * V);
  prefill.logits(want.data());

  ZayaModel decode(config, 1, 1);
  std::copy(prefill.params(), prefill.params() + prefill.registry().total(), decode.params());
  decode.balancing_biases() = prefill.balancing_biases();
  for (int round = 0; round < 2; ++round) {  // a second sequence reuses the cleared state
    decode.start_decode(T);
    double worst = 0;
    std::vector<float> got(V);
    for (int64_t t = 0; t < T; ++t) {
      decode.decode_step(tokens[t], t, got.data());
      // Relative to the row's scale: fp32 sums in another order (a GEMM over
      // the sequence vs one row) differ by rounding, amplified by the 10x weights.
      double scale = 0, diff = 0;
      for (int64_t v = 0; v < V; ++v) {
        scale = std::max(scale, std::abs(static_cast<double>(want[t * V + v])));
        diff = std::max(diff, std::abs(static_cast<double>(got[v]) - want[t * V + v]));
      }
      worst = std::max(worst, diff / scale);
    }
    EXPECT_LT(worst, 1e-5) << "round " << round << ", top-" << top_k;
  }
  EXPECT_THROW(decode.decode_step(tokens[0], T, std::vector<float>(V).data()), InputError);
  EXPECT_THROW(prefill.start_decode(T), InputError);  // built for a batch, not for decode
}

TEST(ZayaDecode, DecodeWithCachesEqualsTheFullPrefill) {
  check_decode_equals_prefill(1);
}

TEST(ZayaDecode, DecodeEqualsPrefillWithTwoExpertsPerToken) {
  check_decode_equals_prefill(2);
}

}  // namespace
}  // namespace anvil::model
