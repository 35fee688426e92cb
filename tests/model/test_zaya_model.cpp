// ZayaModel's memory and its expert-parallel seam. The plan is the arenas:
// parameters and gradients the registry's bytes, the bf16 arena the weights'
// copy plus the two conversion buffers, activations the same in fp32 and
// bf16, plus whatever the dispatchers hold outside it. A dispatcher factory
// is called once per MoE layer, and a dispatcher that copies the experts'
// rows through buffers of its own leaves the loss, the choices and every
// gradient bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/model/zaya_model.hpp"
#include "support/copying_dispatcher.hpp"
#include "support/zaya_setup.hpp"

namespace anvil::model {
namespace {

ModelConfig tiny() {
  return load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
}

MakeDispatcher copying(size_t heap, std::vector<int64_t>* tokens_seen = nullptr) {
  return [heap, tokens_seen](const ZayaMoeShape& shape, int64_t tokens) {
    if (tokens_seen != nullptr) tokens_seen->push_back(tokens);
    return std::make_unique<::test_support::CopyingDispatcher>(shape, tokens, heap);
  };
}

TEST(ZayaModel, ThePlanIsTheArenasAndTheDispatchersHeap) {
  const ModelConfig c = tiny();
  const int64_t B = 2, T = c.seq_len, N = B * T;
  ZayaModel fp32(c, B, T), bf16(c, B, T, {}, {}, Precision::bf16);
  const size_t weights = static_cast<size_t>(fp32.registry().total());
  EXPECT_EQ(fp32.plan().parameters, weights * sizeof(float));
  EXPECT_EQ(fp32.plan().gradients, weights * sizeof(float));
  EXPECT_EQ(fp32.plan().low_precision, 0u);
  // The bf16 copy of the weights and two conversion buffers sized for the
  // widest layer: CCA's N x (q + k channels) or the experts' N k x 2F.
  const int64_t channels = (c.n_heads + 2) * c.head_dim;
  const int64_t capacity = std::max(N * std::max(c.d_model, channels),
                                    N * c.top_k * std::max(2 * c.expert_ffn_hidden, c.d_model));
  EXPECT_EQ(bf16.plan().low_precision,
            tensor::Arena::rounded(weights * 2) + 2 * tensor::Arena::rounded(capacity * 2));
  EXPECT_EQ(bf16.plan().activations, fp32.plan().activations);

  std::vector<int64_t> tokens_seen;
  ZayaModel none(c, B, T, {}, {}, Precision::fp32, copying(0, &tokens_seen));
  ZayaModel some(c, B, T, {}, {}, Precision::fp32, copying(1000));
  EXPECT_EQ(tokens_seen, std::vector<int64_t>(c.n_layers, N));
  EXPECT_EQ(some.plan().activations - none.plan().activations, 1000u * c.n_layers);
}

TEST(ZayaModel, ADispatcherThatMovesRowsElsewhereChangesNothingThatIsComputed) {
  const ModelConfig c = tiny();
  const int64_t B = 2, T = c.seq_len, N = B * T;
  ZayaModel local(c, B, T), moved(c, B, T, {}, {}, Precision::fp32, copying(0));
  test_support::move_away_from_init(local, 3);
  std::copy(local.params(), local.params() + local.registry().total(), moved.params());
  const auto [tokens, targets] = test_support::random_batch(c.vocab_size, N, 6);
  test_support::spread_choices(local, tokens, targets, 50);
  moved.balancing_biases() = local.balancing_biases();
  int64_t scored = 0;
  local.zero_grads();
  moved.zero_grads();
  const double want = local.forward_backward(tokens.data(), targets.data(), 1.0f / N, &scored);
  const double got = moved.forward_backward(tokens.data(), targets.data(), 1.0f / N, &scored);
  EXPECT_EQ(got, want);
  for (int64_t m = 0; m < c.n_layers; ++m) {
    const auto a = moved.moe_layer(m).choices(), b = local.moe_layer(m).choices();
    EXPECT_EQ(std::vector<int32_t>(a.begin(), a.end()), std::vector<int32_t>(b.begin(), b.end()));
  }
  const int64_t n = local.registry().total();
  EXPECT_EQ(std::vector<float>(moved.grads(), moved.grads() + n),
            std::vector<float>(local.grads(), local.grads() + n));
}

}  // namespace
}  // namespace anvil::model
