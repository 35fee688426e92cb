// The GPU training path (CTest label `gpu`): device_layers.hpp's kernels on
// a CUDA stream against the same calls on a CPU stream, and the device
// decoder on CUDA against itself on the CPU device (which the CPU tests
// check against Decoder): the loss and every gradient of gpt2-tiny and
// llama-tiny. Skipped with the reason where no GPU can be used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/device/fused_attention.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/kernels/device_layers.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/device_decoder.hpp"
#include "support/gpu_test.hpp"

namespace anvil::model {
namespace {

using device::DeviceBuffer;
using device::DeviceKind;
using device::Stream;

class GpuDecoder : public test_support::GpuTest {};
using test_support::on_device;

std::vector<float> values(size_t n, uint32_t seed) {
  return test_support::uniform_values(n, seed);
}

double max_gap(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  double gap = 0, scale = floor;
  for (size_t i = 0; i < got.size(); ++i) {
    gap = std::max(gap, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return gap / scale;
}

TEST_F(GpuDecoder, SoftmaxEmbeddingAndBiasKernelsMatchTheCpuStream) {
  Stream gpu(DeviceKind::cuda), cpu(DeviceKind::cpu);
  const int64_t T = 300, heads = 3, rows = heads * T;
  std::vector<float> scores = values(rows * T, 1), lse(rows);
  auto d_scores = on_device(scores, gpu);
  DeviceBuffer d_lse(DeviceKind::cuda, rows * 4, "lse");
  kernels::dev::causal_softmax_forward(cpu, scores.data(), lse.data(), rows, T, 0.125f);
  kernels::dev::causal_softmax_forward(gpu, d_scores.as<float>(), d_lse.as<float>(), rows, T,
                                       0.125f);
  EXPECT_LT(max_gap(device::download<float>(d_scores.data(), rows * T, gpu), scores, 1e-6), 1e-5);
  EXPECT_LT(max_gap(device::download<float>(d_lse.data(), rows, gpu), lse, 1e-6), 1e-5);

  std::vector<float> dp = values(rows * T, 2);
  auto d_dp = on_device(dp, gpu);
  kernels::dev::causal_softmax_backward(cpu, dp.data(), scores.data(), rows, T, 0.125f);
  kernels::dev::causal_softmax_backward(gpu, d_dp.as<float>(), d_scores.as<float>(), rows, T,
                                        0.125f);
  EXPECT_LT(max_gap(device::download<float>(d_dp.data(), rows * T, gpu), dp, 1e-6), 1e-4);

  // 300 columns: two column tiles of the token kernel; 800 rows: chunks
  // of 13 rows in the column sums.
  const int64_t B = 4, S = 200, C = 300, V = 40;
  std::vector<int32_t> tokens(B * S);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  const std::vector<float> dout = values(B * S * C, 3);
  std::vector<float> dwte = values(V * C, 4), dwpe = values(S * C, 5), dbias = values(C, 6);
  kernels::dev::TokenGroups groups;
  kernels::dev::group_by_token(tokens.data(), B * S, &groups);
  auto g_tokens = on_device(tokens, gpu), g_dout = on_device(dout, gpu),
       g_groups = on_device(groups.packed, gpu);
  auto g_dwte = on_device(dwte, gpu), g_dwpe = on_device(dwpe, gpu),
       g_dbias = on_device(dbias, gpu);
  DeviceBuffer scratch(device::DeviceKind::cuda,
                       kernels::dev::column_sum_scratch(C) * sizeof(float), "scratch");
  kernels::dev::embedding_backward(cpu, dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, S,
                                   C, nullptr, 0);
  kernels::dev::embedding_backward(gpu, g_dwte.as<float>(), g_dwpe.as<float>(), g_dout.as<float>(),
                                   g_tokens.as<int32_t>(), B, S, C, g_groups.as<int32_t>(),
                                   groups.count);
  kernels::dev::bias_backward(cpu, dbias.data(), dout.data(), B * S, C, nullptr);
  kernels::dev::bias_backward(gpu, g_dbias.as<float>(), g_dout.as<float>(), B * S, C,
                              scratch.as<float>());
  EXPECT_LT(max_gap(device::download<float>(g_dwte.data(), V * C, gpu), dwte, 1e-6), 1e-5);
  EXPECT_LT(max_gap(device::download<float>(g_dwpe.data(), S * C, gpu), dwpe, 1e-6), 1e-5);
  EXPECT_LT(max_gap(device::download<float>(g_dbias.data(), C, gpu), dbias, 1e-6), 1e-5);
}

// tests/configs' gpt2-tiny and llama-tiny, inline: the GPU check runs this
// binary from a bundle without the source tree.
ModelConfig tiny(const std::string& name) {
  const char* gpt2 =
      R"({"name": "gpt2-tiny", "d_model": 48, "n_layers": 2, "n_heads": 3, "n_kv_heads": 3, "head_dim": 16, "vocab_size": 67, "seq_len": 70, "ffn_hidden": 96, "mlp": "gelu", "norm": "layernorm", "position": "learned", "attention": "mha", "tied_embeddings": true})";
  const char* llama =
      R"({"name": "llama-tiny", "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab_size": 61, "seq_len": 70, "ffn_hidden": 80, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "attention": "gqa", "tied_embeddings": false, "bias": false, "rotary_dim": 8})";
  return parse_model_config(name == "gpt2-tiny" ? gpt2 : llama, name);
}

// ANVIL_ATTENTION set to `value` for the guard's life, then unset.
struct AttentionChoice {
  explicit AttentionChoice(const char* value) { ::setenv("ANVIL_ATTENTION", value, 1); }
  ~AttentionChoice() { ::unsetenv("ANVIL_ATTENTION"); }
  AttentionChoice(const AttentionChoice&) = delete;
  AttentionChoice& operator=(const AttentionChoice&) = delete;
};

// One training micro-batch on CUDA and on the CPU device from the same
// weights: the loss within `loss_tol`, every gradient within `grad_tol` of
// the largest gradient entry. `attention` is the GPU's ANVIL_ATTENTION; the
// CPU device, which has only the unfused attention, is built without it
// (=fused would be an error there).
void expect_cuda_matches_cpu(const std::string& name, Precision precision, bool tf32,
                             double loss_tol, double grad_tol, const char* attention = "auto",
                             int64_t B = 2, int64_t T = 64) {
  const ModelConfig c = tiny(name);
  DeviceDecoder cpu(c, B, T, true, DeviceKind::cpu, precision);
  const AttentionChoice choice(attention);
  DeviceDecoder gpu(c, B, T, true, DeviceKind::cuda, precision, tf32);
  gpu.registry().initialize(gpu.params(), 3);
  cpu.registry().initialize(cpu.params(), 3);
  std::mt19937 rng(9);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(rng() % c.vocab_size);
    targets[i] = i % 5 == 0 ? -1 : static_cast<int32_t>(rng() % c.vocab_size);
  }
  int64_t s1 = 0, s2 = 0;
  const double want = cpu.forward_backward(tokens.data(), targets.data(), B, T, 0.5f, &s1);
  const double got = gpu.forward_backward(tokens.data(), targets.data(), B, T, 0.5f, &s2);
  EXPECT_EQ(s1, s2);
  EXPECT_LE(std::fabs(got - want), loss_tol * std::fabs(want))
      << name << ": " << got << " vs " << want;
  const size_t n = static_cast<size_t>(cpu.registry().total());
  const std::vector<float> g(gpu.grads(), gpu.grads() + n), w(cpu.grads(), cpu.grads() + n);
  EXPECT_LT(max_gap(g, w, 0.0), grad_tol) << name;
}

TEST_F(GpuDecoder, Gpt2AndLlamaTinyMatchTheCpuDeviceInFp32) {
  expect_cuda_matches_cpu("gpt2-tiny", Precision::fp32, false, 1e-5, 1e-4);
  expect_cuda_matches_cpu("llama-tiny", Precision::fp32, false, 1e-5, 1e-4);
}

// 20 x 64 = 1280 rows: the classifier's logits in two chunks (1024 rows,
// then 256), which the 128-row runs above never reach.
TEST_F(GpuDecoder, RowsPastOneClassifierChunkMatchTheCpuDevice) {
  expect_cuda_matches_cpu("gpt2-tiny", Precision::fp32, false, 1e-5, 1e-4, "auto", 20, 64);
  expect_cuda_matches_cpu("llama-tiny", Precision::bf16, false, 1e-4, 1e-3, "unfused", 20, 64);
}

TEST_F(GpuDecoder, Tf32StaysWithinTf32Rounding) {
  expect_cuda_matches_cpu("gpt2-tiny", Precision::fp32, true, 2e-3, 2e-2);
}

// The same bf16-rounded inputs on both devices; only the summation order
// of the fp32 accumulations differs (the unfused attention on both).
TEST_F(GpuDecoder, Bf16MatchesTheCpuDeviceInBf16) {
  expect_cuda_matches_cpu("gpt2-tiny", Precision::bf16, false, 1e-4, 1e-3, "unfused");
  expect_cuda_matches_cpu("llama-tiny", Precision::bf16, false, 1e-4, 1e-3, "unfused");
}

// cuDNN's fused attention (bf16 q, k, v, out and gradients; fp32 softmax
// statistics) against the unfused fp32 attention of the same bf16 run:
// the loss within 5e-3 relative and every gradient within 5e-2 of the
// largest, the size of bf16 rounding of attention's outputs and gradients.
TEST_F(GpuDecoder, FusedAttentionMatchesTheUnfusedAttentionInBf16) {
  const std::string why = device::fused_attention_unavailable();
  if (!why.empty()) GTEST_SKIP() << "fused attention: " << why;
  expect_cuda_matches_cpu("gpt2-tiny", Precision::bf16, false, 5e-3, 5e-2, "fused");
  expect_cuda_matches_cpu("llama-tiny", Precision::bf16, false, 5e-3, 5e-2, "fused");
}

// The fused backward three times on the same inputs repeats its bits
// (cuDNN's deterministic algorithm: by default dQ's fp32 sums follow the
// order its blocks finish), with a workspace within the bound the memory
// plan counts. T = 512: several key blocks per query block; GQA.
TEST_F(GpuDecoder, FusedAttentionBackwardRepeatsItsBitsWithinThePlannedWorkspace) {
  const std::string why = device::fused_attention_unavailable();
  if (!why.empty()) GTEST_SKIP() << "fused attention: " << why;
  const device::AttentionShape s{2, 512, 8, 2, 64, 0.125f};
  Stream stream(DeviceKind::cuda);
  device::FusedAttention fused(s, stream);
  EXPECT_LE(fused.workspace_bytes(), device::fused_attention_workspace_bound(s));
  const int64_t N = s.B * s.T, Q = (s.Hq + 2 * s.Hkv) * s.D, A = s.Hq * s.D;
  const auto low = [](const std::vector<float>& v) {
    std::vector<bf16> b(v.size());
    to_bf16(b.data(), v.data(), static_cast<int64_t>(v.size()));
    return b;
  };
  DeviceBuffer qkv = on_device(low(values(static_cast<size_t>(N * Q), 21)), stream);
  DeviceBuffer dout = on_device(low(values(static_cast<size_t>(N * A), 22)), stream);
  DeviceBuffer out(DeviceKind::cuda, static_cast<size_t>(N * A) * sizeof(bf16), "out");
  DeviceBuffer stats(DeviceKind::cuda, static_cast<size_t>(N * s.Hq) * sizeof(float), "stats");
  DeviceBuffer dqkv(DeviceKind::cuda, static_cast<size_t>(N * Q) * sizeof(bf16), "dqkv");
  fused.forward(qkv.as<bf16>(), out.as<bf16>(), stats.as<float>());
  std::vector<std::vector<bf16>> runs;
  for (int r = 0; r < 3; ++r) {
    fused.backward(qkv.as<bf16>(), out.as<bf16>(), dout.as<bf16>(), stats.as<float>(),
                   dqkv.as<bf16>());
    std::vector<bf16> host(static_cast<size_t>(N * Q));
    device::copy(host.data(), dqkv.data(), host.size() * sizeof(bf16),
                 device::CopyKind::device_to_host, stream);
    stream.synchronize();
    runs.push_back(std::move(host));
  }
  for (int r = 1; r < 3; ++r)
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[r].data(), runs[0].size() * sizeof(bf16)), 0)
        << "backward " << r + 1 << " differs from the first";
}

// Decoding (the KV cache in GPU memory) against the CPU device, position by
// position over the whole context, from the same weights.
TEST_F(GpuDecoder, DecodingMatchesTheCpuDevicePositionByPosition) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig c = tiny(name);
    DeviceDecoder gpu(c, 1, 1, false, DeviceKind::cuda);
    DeviceDecoder cpu(c, 1, 1, false, DeviceKind::cpu);
    gpu.registry().initialize(gpu.params(), 4);
    cpu.registry().initialize(cpu.params(), 4);
    gpu.start_decode(c.seq_len);
    cpu.start_decode(c.seq_len);
    std::mt19937 rng(2);
    std::vector<float> got(static_cast<size_t>(c.vocab_size)), want(got.size());
    for (int64_t pos = 0; pos < c.seq_len; ++pos) {
      const auto token = static_cast<int32_t>(rng() % c.vocab_size);
      gpu.decode_step(token, pos, got.data());
      cpu.decode_step(token, pos, want.data());
      EXPECT_LT(max_gap(got, want, 1e-6), 1e-5) << name << " position " << pos;
    }
  }
}

}  // namespace
}  // namespace anvil::model
