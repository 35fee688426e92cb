// The device decoder on the CPU device: the same orchestration a GPU runs
// (device arenas, the GEMM engine, device_layers.hpp, unfused attention),
// checked against Decoder on the same weights and batch: loss, every
// gradient, the scored count, several micro-batches, a smaller batch than
// planned, and the refusals. Plus device_layers.hpp's softmax and
// cross-entropy loops against direct formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/kernels/device_layers.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/device_decoder.hpp"
#include "support/gradient_check.hpp"

namespace anvil::model {
namespace {

ModelConfig tiny(const std::string& name, std::vector<std::string> overrides = {}) {
  return load_model_config(std::string(ANVIL_SOURCE_DIR) + "/tests/configs/" + name + ".json",
                           overrides);
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V) - 1);
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(tok(gen));
    b.targets.push_back(i % 7 == 3 ? -1 : tok(gen));  // some rows not scored
  }
  return b;
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i])));
  return m;
}

// max |a - b| over max |b|, tight enough that a dropped term fails. `floor`
// stands in for a tensor whose exact gradient is zero (k_proj's bias: a
// shift of every key's score by the same amount leaves softmax unchanged),
// where both sides hold rounding noise.
double relative_gap(const float* a, const float* b, int64_t n, double floor) {
  double gap = 0;
  for (int64_t i = 0; i < n; ++i) gap = std::max(gap, std::fabs(static_cast<double>(a[i]) - b[i]));
  return gap / std::max(max_abs(b, n), floor);
}

// Every parameter tensor's gradient against Decoder's, one by one.
void expect_same_training_step(const ModelConfig& c, int64_t B, int64_t T, int micro_batches,
                               Precision precision = Precision::fp32, double tolerance = 2e-4) {
  Decoder ref(c, B, T, true, precision);
  DeviceDecoder dev(c, B, T, true, device::DeviceKind::cpu, precision);
  ref.registry().initialize(ref.params(), 7);
  dev.registry().initialize(dev.params(), 7);
  ref.zero_grads();
  dev.zero_grads();
  for (int m = 0; m < micro_batches; ++m) {
    const Batch b = random_batch(B * T, c.vocab_size, 11 + m);
    int64_t ref_scored = 0, dev_scored = 0;
    const double ref_loss =
        ref.forward_backward(b.tokens.data(), b.targets.data(), B, T, 0.25f, &ref_scored);
    const double dev_loss =
        dev.forward_backward(b.tokens.data(), b.targets.data(), B, T, 0.25f, &dev_scored);
    EXPECT_EQ(dev_scored, ref_scored);
    EXPECT_NEAR(dev_loss, ref_loss, tolerance / 10 * std::fabs(ref_loss)) << "micro-batch " << m;
  }
  const double floor = 1e-3 * max_abs(ref.grads(), ref.registry().total());
  for (const ParamSpec& p : ref.registry().specs()) {
    EXPECT_LT(relative_gap(dev.grads() + p.offset, ref.grads() + p.offset, p.numel, floor),
              tolerance)
        << c.name << " " << p.name;
  }
}

TEST(DeviceDecoder, Gpt2TinyTrainingStepMatchesTheDecoder) {
  expect_same_training_step(tiny("gpt2-tiny"), 2, 20, 1);
}

TEST(DeviceDecoder, LlamaTinyWithGqaAndRopeMatchesTheDecoderOverMicroBatches) {
  expect_same_training_step(tiny("llama-tiny"), 2, 24, 2);
}

TEST(DeviceDecoder, BiasesAndAnUntiedHeadMatchTheDecoder) {
  expect_same_training_step(tiny("llama-tiny", {"bias=true", "tied_embeddings=true"}), 1, 17, 1);
}

// bf16 converts the same tensors at the same points as Decoder (weights
// once per upload, each GEMM's activation and gradient inputs), so the two
// agree as closely as in fp32 where their attention is the same fp32. Where
// Decoder's attention runs on the bf16 tiles (AVX512_BF16; the device
// decoder's CPU attention stays fp32), they agree to bf16's resolution.
TEST(DeviceDecoder, Bf16MatmulsMatchTheDecodersBf16) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig c = tiny(name);
    const bool bf16_tiles =
        kernels::attention_tiles_for(true, c.head_dim) == kernels::AttentionTiles::bf16;
    SCOPED_TRACE(bf16_tiles ? "bf16 attention tiles" : "fp32 attention");
    const int64_t T = name[0] == 'g' ? 20 : 24;
    // With fp32 attention the two still round the matmuls' inputs to bf16
    // after fp32 sums added in other orders: an input one bf16 step (2^-8)
    // apart moves k_proj's weight gradient, which is small against its
    // terms (softmax ignores a shift of every score), by 3e-4 of its largest
    // (Intel Xeon with AMX under ANVIL_ISA=avx2); 1e-3 leaves a 3x margin and
    // stays 10x under the bf16 tiles' bound.
    expect_same_training_step(c, 2, T, name[0] == 'g' ? 2 : 1, Precision::bf16,
                              bf16_tiles ? 1e-2 : 1e-3);
  }
}

TEST(DeviceDecoder, ASmallerBatchThanPlannedAndUpdatedWeightsAreSeen) {
  const auto c = tiny("gpt2-tiny");
  Decoder ref(c, 1, 9, false);
  DeviceDecoder dev(c, 3, 30, false, device::DeviceKind::cpu);
  EXPECT_EQ(dev.plan().gradients, 0u);
  const Batch b = random_batch(9, c.vocab_size, 3);
  for (int round = 0; round < 2; ++round) {
    // Writing through params() must reach the device copy before the next forward.
    ref.registry().initialize(ref.params(), 20 + round);
    dev.registry().initialize(dev.params(), 20 + round);
    int64_t s1 = 0, s2 = 0;
    const double want = ref.forward(b.tokens.data(), b.targets.data(), 1, 9, &s1);
    const double got = dev.forward(b.tokens.data(), b.targets.data(), 1, 9, &s2);
    EXPECT_NEAR(got, want, 2e-5 * std::fabs(want));
    EXPECT_EQ(s1, s2);
  }
}

// Decoding through the KV cache (one query row against the cached keys and
// values, per key/value head one strided-batch GEMM) gives Decoder's
// logits at every position: gpt2-tiny (learned positions, biases, MHA) and
// llama-tiny (RoPE, GQA with 2 query heads per key/value head).
void expect_same_decoding(const ModelConfig& c) {
  Decoder ref(c, 1, 1, false);
  DeviceDecoder dev(c, 1, 1, false, device::DeviceKind::cpu);
  ref.registry().initialize(ref.params(), 5);
  dev.registry().initialize(dev.params(), 5);
  const int64_t n = c.seq_len;
  ref.start_decode(n);
  dev.start_decode(n);
  const Batch b = random_batch(n, c.vocab_size, 4);
  std::vector<float> want(static_cast<size_t>(c.vocab_size)), got(want.size());
  for (int64_t pos = 0; pos < n; ++pos) {
    ref.decode_step(b.tokens[pos], pos, want.data());
    dev.decode_step(b.tokens[pos], pos, got.data());
    ASSERT_LT(relative_gap(got.data(), want.data(), c.vocab_size, 1e-6), 1e-5)
        << c.name << " position " << pos;
  }
  EXPECT_THROW(dev.decode_step(0, n, got.data()), InputError);
  EXPECT_THROW(dev.decode_step(static_cast<int32_t>(c.vocab_size), 0, got.data()), InputError);
  // A new sequence starts from an empty cache: position 0 again.
  dev.start_decode(4);
  ref.start_decode(4);
  ref.decode_step(b.tokens[3], 0, want.data());
  dev.decode_step(b.tokens[3], 0, got.data());
  EXPECT_LT(relative_gap(got.data(), want.data(), c.vocab_size, 1e-6), 1e-5) << c.name;
}

TEST(DeviceDecoder, DecodingWithAKvCacheGivesTheDecodersLogits) {
  expect_same_decoding(tiny("gpt2-tiny"));
  expect_same_decoding(tiny("llama-tiny"));
  DeviceDecoder training(tiny("gpt2-tiny"), 1, 4, true, device::DeviceKind::cpu);
  EXPECT_THROW(training.start_decode(4), InputError);
  DeviceDecoder inference(tiny("gpt2-tiny"), 1, 1, false, device::DeviceKind::cpu);
  EXPECT_THROW(inference.start_decode(71), InputError);  // past seq_len 70
}

TEST(DeviceDecoder, RefusesWhatTheDecoderRefuses) {
  const auto c = tiny("gpt2-tiny");
  DeviceDecoder dev(c, 1, 8, true, device::DeviceKind::cpu);
  Batch b = random_batch(8, c.vocab_size, 5);
  int64_t scored = 0;
  b.tokens[2] = static_cast<int32_t>(c.vocab_size);
  EXPECT_THROW(dev.forward(b.tokens.data(), b.targets.data(), 1, 8, &scored), InputError);
  b.tokens[2] = 0;
  EXPECT_THROW(dev.forward(b.tokens.data(), b.targets.data(), 2, 8, &scored), InputError);
  b.targets[4] = static_cast<int32_t>(c.vocab_size);
  EXPECT_THROW(dev.forward_backward(b.tokens.data(), b.targets.data(), 1, 8, 1.0f, &scored),
               std::out_of_range);
  EXPECT_THROW(DeviceDecoder(c, 1, c.seq_len + 1, true, device::DeviceKind::cpu), InputError);
  EXPECT_THROW(DeviceDecoder(tiny("zaya-tiny"), 1, 8, true, device::DeviceKind::cpu), InputError);
  DeviceDecoder inference(c, 1, 8, false, device::DeviceKind::cpu);
  b.targets[4] = 0;
  EXPECT_THROW(inference.forward_backward(b.tokens.data(), b.targets.data(), 1, 8, 1.0f, &scored),
               InputError);
}

TEST(DeviceDecoder, ArenasAreThePlan) {
  const auto c = tiny("llama-tiny");
  const MemoryPlan p = DeviceDecoder::plan_for(c, 2, 16, true);
  DeviceDecoder dev(c, 2, 16, true, device::DeviceKind::cpu);
  EXPECT_EQ(dev.plan().parameters, p.parameters);
  EXPECT_EQ(dev.plan().activations, p.activations);
  EXPECT_EQ(p.gradients, p.parameters);
  EXPECT_LT(DeviceDecoder::plan_for(c, 2, 16, false).activations, p.activations);
  EXPECT_EQ(p.low_precision, 0u);
  DeviceDecoder mixed(c, 2, 16, true, device::DeviceKind::cpu, Precision::bf16);
  EXPECT_EQ(mixed.plan().low_precision,
            DeviceDecoder::plan_for(c, 2, 16, true, Precision::bf16).low_precision);
  EXPECT_GE(mixed.plan().low_precision, static_cast<size_t>(mixed.registry().total()) * 2);
}

TEST(DeviceLayers, CausalSoftmaxAndItsBackwardMatchTheFormulas) {
  const int64_t T = 5, heads = 2, rows = heads * T;
  const float scale = 0.7f;
  std::vector<float> scores = test_support::random_vector(rows * T, 1);
  const std::vector<float> raw = scores;
  std::vector<float> lse(rows);
  device::Stream s;
  kernels::dev::causal_softmax_forward(s, scores.data(), lse.data(), rows, T, scale);
  std::vector<float> dp = test_support::random_vector(rows * T, 2);
  const std::vector<float> dp_in = dp;
  kernels::dev::causal_softmax_backward(s, dp.data(), scores.data(), rows, T, scale);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t last = r % T;
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, double{scale} * raw[r * T + j]);
    for (int64_t j = 0; j <= last; ++j) sum += std::exp(scale * raw[r * T + j] - mx);
    EXPECT_NEAR(lse[r], mx + std::log(sum), 1e-5);
    double dot = 0;
    for (int64_t j = 0; j <= last; ++j) {
      const double p = std::exp(scale * raw[r * T + j] - mx) / sum;
      dot += p * dp_in[r * T + j];
    }
    for (int64_t j = 0; j < T; ++j) {
      if (j > last) {
        EXPECT_EQ(scores[r * T + j], 0.0f);
        EXPECT_EQ(dp[r * T + j], 0.0f);
        continue;
      }
      const double p = std::exp(scale * raw[r * T + j] - mx) / sum;
      EXPECT_NEAR(scores[r * T + j], p, 1e-6 + 1e-5 * p);
      const double ds = p * (dp_in[r * T + j] - dot) * scale;
      EXPECT_NEAR(dp[r * T + j], ds, 1e-6 + 1e-4 * std::fabs(ds));
    }
  }
}

// The queries as the last rows of the sequence (a KV cache's decoded
// tokens): row r of each block of `queries` sees keys 0..T - queries + r.
TEST(DeviceLayers, CausalSoftmaxOfTheLastQueriesSeesTheirKeys) {
  const int64_t T = 6, queries = 2, rows = 3 * queries;
  std::vector<float> scores = test_support::random_vector(rows * T, 3);
  const std::vector<float> raw = scores;
  std::vector<float> lse(rows);
  device::Stream s;
  kernels::dev::causal_softmax_forward(s, scores.data(), lse.data(), rows, T, 0.5f, queries);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t last = T - queries + r % queries;
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, 0.5 * raw[r * T + j]);
    for (int64_t j = 0; j <= last; ++j) sum += std::exp(0.5 * raw[r * T + j] - mx);
    EXPECT_NEAR(lse[r], mx + std::log(sum), 1e-5) << r;
    for (int64_t j = 0; j < T; ++j) {
      const double p = j <= last ? std::exp(0.5 * raw[r * T + j] - mx) / sum : 0.0;
      EXPECT_NEAR(scores[r * T + j], p, 1e-6 + 1e-5 * p) << r << " " << j;
    }
  }
  EXPECT_THROW(kernels::dev::causal_softmax_forward(s, scores.data(), lse.data(), rows, T, 0.5f, 7),
               InputError);
}

// The fused attention's outputs come back from bf16 exactly; the CPU device
// never fuses attention, and asking for it there says why not.
TEST(DeviceLayers, Bf16ComesBackExactlyAndTheCpuDeviceKeepsUnfusedAttention) {
  const std::vector<float> values = test_support::random_vector(1000, 9);
  std::vector<bf16> half(values.size());
  device::Stream s;
  kernels::dev::convert_to_bf16(s, half.data(), values.data(), 1000);
  std::vector<float> back(values.size());
  kernels::dev::convert_from_bf16(s, back.data(), half.data(), 1000);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(back[i], to_float(half[i])) << i;
  EXPECT_FALSE(DeviceDecoder::fuses_attention(device::DeviceKind::cpu, Precision::bf16));
  ::setenv("ANVIL_ATTENTION", "fused", 1);
  EXPECT_THROW(DeviceDecoder::fuses_attention(device::DeviceKind::cpu, Precision::bf16),
               InputError);
  EXPECT_FALSE(DeviceDecoder::fuses_attention(device::DeviceKind::cpu, Precision::fp32));
  ::unsetenv("ANVIL_ATTENTION");
}

// The GPU's embedding backward reads the rows grouped by token: distinct
// tokens ascending, their offsets, then each token's rows in order.
TEST(DeviceLayers, GroupByTokenListsEachTokensRowsInOrder) {
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 1, 3};
  kernels::dev::TokenGroups g;
  kernels::dev::group_by_token(tokens.data(), 6, &g);
  EXPECT_EQ(g.count, 3);
  EXPECT_EQ(g.packed,
            (std::vector<int32_t>{0, 1, 3, /*offsets*/ 0, 1, 3, 6, /*rows*/ 3, 1, 4, 0, 2, 5}));
  kernels::dev::group_by_token(tokens.data(), 0, &g);
  EXPECT_EQ(g.count, 0);
  EXPECT_EQ(g.packed, std::vector<int32_t>{0});
}

TEST(DeviceLayers, CrossEntropyRowsAndBiasColumnSums) {
  const int64_t N = 3, V = 6;
  std::vector<float> logits = test_support::random_vector(N * V, 3, 2.0f);
  const std::vector<float> raw = logits;
  const std::vector<int32_t> targets = {2, -1, 5};
  std::vector<float> loss(N);
  device::Stream s;
  kernels::dev::cross_entropy(s, logits.data(), loss.data(), targets.data(), N, V, 0.5f);
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e30, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double{raw[n * V + j]});
    for (int64_t j = 0; j < V; ++j) sum += std::exp(raw[n * V + j] - mx);
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(raw[n * V + j] - mx) / sum;
      const double want = targets[n] < 0 ? 0.0 : 0.5 * (p - (j == targets[n] ? 1.0 : 0.0));
      EXPECT_NEAR(logits[n * V + j], want, 1e-6);
    }
    const double want_loss = targets[n] < 0 ? 0.0 : mx + std::log(sum) - raw[n * V + targets[n]];
    EXPECT_NEAR(loss[n], want_loss, 1e-5);
  }
  std::vector<float> dbias = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  kernels::dev::bias_backward(s, dbias.data(), raw.data(), N, V, nullptr);
  for (int64_t j = 0; j < V; ++j) {
    const double want = (j + 1) + raw[j] + raw[V + j] + raw[2 * V + j];
    EXPECT_NEAR(dbias[j], want, 1e-5);
  }
}

}  // namespace
}  // namespace anvil::model
