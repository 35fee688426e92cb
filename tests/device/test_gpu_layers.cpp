// The dense layers' CUDA kernels (kernels/gpu_layers.hpp) against the CPU
// layers on the same inputs (CTest label `gpu`). The element-wise kernels
// run the CPU's bodies, so they agree to a few ulps (the GPU's FMA
// contraction); the row kernels reduce in another order, so their
// tolerance is relative to the values. Skipped with the reason where no GPU
// can be used; test_bodies.cpp checks the same arithmetic on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "anvil/device/runtime.hpp"
#include "anvil/kernels/gpu_layers.hpp"
#include "anvil/kernels/layers.hpp"
#include "support/device_adamw_check.hpp"
#include "support/device_muon_check.hpp"
#include "support/gpu_test.hpp"

namespace anvil::kernels {
namespace {

using device::DeviceBuffer;
using device::DeviceKind;
using device::Stream;

class GpuLayers : public test_support::GpuTest {};
using test_support::on_device;

std::vector<float> values(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return test_support::uniform_values(n, seed, lo, hi);
}

std::vector<float> back(const DeviceBuffer& b, size_t n, Stream& stream) {
  return device::download<float>(b.data(), n, stream);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += !(std::fabs(got[i] - want[i]) <= rel * (1.0f + std::fabs(want[i])));
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

TEST_F(GpuLayers, ElementwiseKernelsMatchTheCpuLayers) {
  Stream stream(DeviceKind::cuda);
  const int64_t N = 37, F = 300, n = N * F;
  const auto x = values(2 * n, 1, -4.0f, 4.0f), d = values(2 * n, 2);
  auto dx = on_device(x, stream), dd = on_device(d, stream);
  DeviceBuffer out(DeviceKind::cuda, 2 * n * 4, "out");

  std::vector<float> want(n);
  gelu_forward(want.data(), x.data(), n);
  gpu::gelu_forward(out.as<float>(), dx.as<float>(), n, stream.native());
  expect_close(back(out, n, stream), want, 1e-6f, "gelu_forward");

  std::vector<float> acc = values(n, 3), want_acc = acc;
  gelu_backward(want_acc.data(), x.data(), d.data(), n);
  auto dacc = on_device(acc, stream);
  gpu::gelu_backward(dacc.as<float>(), dx.as<float>(), dd.as<float>(), n, stream.native());
  expect_close(back(dacc, n, stream), want_acc, 1e-6f, "gelu_backward");

  swiglu_forward(want.data(), x.data(), N, F);
  gpu::swiglu_forward(out.as<float>(), dx.as<float>(), N, F, stream.native());
  expect_close(back(out, n, stream), want, 1e-6f, "swiglu_forward");

  std::vector<float> gacc = values(2 * n, 4), want_g = gacc;
  swiglu_backward(want_g.data(), d.data(), x.data(), N, F);
  auto dg = on_device(gacc, stream);
  gpu::swiglu_backward(dg.as<float>(), dd.as<float>(), dx.as<float>(), N, F, stream.native());
  expect_close(back(dg, 2 * n, stream), want_g, 1e-6f, "swiglu_backward");

  residual_forward(want.data(), x.data(), d.data(), n);
  gpu::residual_forward(out.as<float>(), dx.as<float>(), dd.as<float>(), n, stream.native());
  expect_close(back(out, n, stream), want, 0.0f, "residual_forward");
}

TEST_F(GpuLayers, NormsMatchTheCpuLayers) {
  Stream stream(DeviceKind::cuda);
  // Up to 517 rows: chunks of several rows over the column sums' 8 lanes.
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{19, 64}, {19, 300}, {517, 1024}}) {
    DeviceBuffer scratch(DeviceKind::cuda, gpu::column_sum_scratch(2 * C) * 4, "scratch");
    const auto x = values(N * C, 5), w = values(C, 6), b = values(C, 7), d = values(N * C, 8);
    auto dx = on_device(x, stream), dw = on_device(w, stream), db = on_device(b, stream),
         dd = on_device(d, stream);
    std::vector<float> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      1e-5f);
    DeviceBuffer gout(DeviceKind::cuda, N * C * 4, "out"), gmean(DeviceKind::cuda, N * 4, "mean"),
        grstd(DeviceKind::cuda, N * 4, "rstd");
    gpu::layernorm_forward(gout.as<float>(), gmean.as<float>(), grstd.as<float>(), dx.as<float>(),
                           dw.as<float>(), db.as<float>(), N, C, 1e-5f, stream.native());
    expect_close(back(gout, N * C, stream), out, 1e-5f, "layernorm_forward");
    expect_close(back(grstd, N, stream), rstd, 1e-5f, "layernorm rstd");

    std::vector<float> gin = values(N * C, 9), gw = values(C, 10), gb = values(C, 11);
    auto g_in = on_device(gin, stream), g_w = on_device(gw, stream), g_b = on_device(gb, stream);
    layernorm_backward(gin.data(), gw.data(), gb.data(), d.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
    gpu::layernorm_backward(g_in.as<float>(), g_w.as<float>(), g_b.as<float>(), dd.as<float>(),
                            dx.as<float>(), dw.as<float>(), gmean.as<float>(), grstd.as<float>(), N,
                            C, scratch.as<float>(), stream.native());
    expect_close(back(g_in, N * C, stream), gin, 1e-4f, "layernorm_backward dinp");
    expect_close(back(g_w, C, stream), gw, 1e-4f, "layernorm_backward dweight");
    expect_close(back(g_b, C, stream), gb, 1e-5f, "layernorm_backward dbias");

    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    gpu::rmsnorm_forward(gout.as<float>(), grstd.as<float>(), dx.as<float>(), dw.as<float>(), N, C,
                         1e-5f, stream.native());
    expect_close(back(gout, N * C, stream), out, 1e-5f, "rmsnorm_forward");
    std::vector<float> rin = values(N * C, 12), rw = values(C, 13);
    auto r_in = on_device(rin, stream), r_w = on_device(rw, stream);
    rmsnorm_backward(rin.data(), rw.data(), d.data(), x.data(), w.data(), rstd.data(), N, C);
    gpu::rmsnorm_backward(r_in.as<float>(), r_w.as<float>(), dd.as<float>(), dx.as<float>(),
                          dw.as<float>(), grstd.as<float>(), N, C, scratch.as<float>(),
                          stream.native());
    expect_close(back(r_in, N * C, stream), rin, 1e-4f, "rmsnorm_backward dinp");
    expect_close(back(r_w, C, stream), rw, 1e-4f, "rmsnorm_backward dweight");
  }
}

TEST_F(GpuLayers, EmbeddingRopeAndAdamWMatchTheCpu) {
  Stream stream(DeviceKind::cuda);
  const int64_t B = 3, T = 17, C = 64, V = 50, N = B * T;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  const auto wte = values(V * C, 14), wpe = values(T * C, 15);
  std::vector<float> emb(N * C);
  embedding_forward(emb.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  auto dt = on_device(tokens, stream), dwte = on_device(wte, stream), dwpe = on_device(wpe, stream);
  DeviceBuffer gemb(DeviceKind::cuda, N * C * 4, "emb");
  gpu::embedding_forward(gemb.as<float>(), dt.as<int32_t>(), dwte.as<float>(), dwpe.as<float>(), N,
                         T, C, stream.native());
  expect_close(back(gemb, N * C, stream), emb, 0.0f, "embedding_forward");

  const int64_t heads = 4, head_dim = 32, stride = heads * head_dim + 16;
  auto q = values(N * stride, 16), want = q;
  rope_forward(want.data(), N, T, 5, heads, head_dim, head_dim, stride, 10000.0f);
  auto dq = on_device(q, stream);
  gpu::rope_apply(dq.as<float>(), N, T, 5, heads, head_dim, head_dim, stride, 10000.0f, 1.0f,
                  stream.native());
  expect_close(back(dq, N * stride, stream), want, 1e-5f, "rope_apply");

  const int64_t n = 10000;
  auto p = values(n, 17), m = values(n, 18, 0.0f, 0.1f), v = values(n, 19, 0.0f, 0.01f);
  const auto g = values(n, 20);
  const body::AdamWStep st{0.9f,
                           0.95f,
                           1e-8f,
                           3e-3f / (1 - 0.9f * 0.9f),
                           std::sqrt(1 - 0.95f * 0.95f),
                           1 - 3e-3f * 0.1f};
  auto dp = on_device(p, stream), dm = on_device(m, stream), dv = on_device(v, stream),
       dgr = on_device(g, stream);
  gpu::adamw_update(dp.as<float>(), dm.as<float>(), dv.as<float>(), dgr.as<float>(), n, st, 0.5f,
                    stream.native());
  for (int64_t i = 0; i < n; ++i) body::adamw(&p[i], &m[i], &v[i], g[i] * 0.5f, st);
  expect_close(back(dp, n, stream), p, 1e-6f, "adamw params");
  expect_close(back(dm, n, stream), m, 1e-6f, "adamw m");
  expect_close(back(dv, n, stream), v, 1e-6f, "adamw v");
}

// The device optimizer step: AdamW within 1e-6 of the host's, the exact
// gradient norm's bits (integer atomics in any order).
TEST_F(GpuLayers, DeviceAdamWMatchesTheHostAdamWAndItsNormBits) {
  test_support::expect_device_adamw_is_adamw(DeviceKind::cuda, 1e-6f);
}

// The device Muon step: the host Muon's updates up to the GEMMs' rounding
// (cuBLASLt's fp32 and bf16 GEMMs against OpenBLAS / oneDNN).
TEST_F(GpuLayers, DeviceMuonMatchesTheHostMuon) {
  test_support::expect_device_muon_is_muon(DeviceKind::cuda, /*ns_bf16=*/false, 1e-4);
  test_support::expect_device_muon_is_muon(DeviceKind::cuda, /*ns_bf16=*/true, 5e-2);
}

// Muon's start on the GPU, with no host wait: u / (|u|_F + 1e-7) within
// float rounding of the host's, and the same bits on a second call (the
// sum's order is fixed).
TEST_F(GpuLayers, UnitNormScalingMatchesTheHostAndRepeatsItsBits) {
  Stream stream(DeviceKind::cuda);
  const int64_t n = 100003;
  const auto u = values(n, 31, -3.0f, 3.0f);
  double norm2 = 0;
  for (float v : u) norm2 += static_cast<double>(v) * v;
  const float factor = body::muon_unit_factor(std::sqrt(norm2));
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = u[i] * factor;
  auto du = on_device(u, stream);
  DeviceBuffer x(DeviceKind::cuda, n * 4, "x"), words(DeviceKind::cuda, 4096, "words");
  auto* partials = static_cast<double*>(words.data());
  auto* f = reinterpret_cast<float*>(partials + gpu::kUnitPartials);
  gpu::scale_to_unit_norm(x.as<float>(), du.as<float>(), n, partials, f, stream.native());
  const auto first = back(x, n, stream);
  expect_close(first, want, 1e-6f, "scale_to_unit_norm");
  gpu::scale_to_unit_norm(x.as<float>(), du.as<float>(), n, partials, f, stream.native());
  EXPECT_EQ(back(x, n, stream), first);
}

TEST_F(GpuLayers, CrossEntropyMatchesTheSoftmaxOnTheCpu) {
  Stream stream(DeviceKind::cuda);
  const int64_t N = 9, V = 1000;
  const auto logits = values(N * V, 21, -5.0f, 5.0f);
  std::vector<int32_t> targets(N);
  for (int64_t r = 0; r < N; ++r) targets[r] = r == 4 ? -1 : static_cast<int32_t>((r * 131) % V);
  auto dl = on_device(logits, stream), dtg = on_device(targets, stream);
  DeviceBuffer loss(DeviceKind::cuda, N * 4, "loss");
  const float scale = 1.0f / 8;
  gpu::cross_entropy(dl.as<float>(), loss.as<float>(), dtg.as<int32_t>(), N, V, scale,
                     stream.native());
  const auto got = back(dl, N * V, stream), got_loss = back(loss, N, stream);
  for (int64_t r = 0; r < N; ++r) {
    const float* l = logits.data() + r * V;
    double mx = l[0], sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max<double>(mx, l[j]);
    for (int64_t j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
    const int32_t t = targets[r];
    EXPECT_NEAR(got_loss[r], t < 0 ? 0.0 : std::log(sum) - (l[t] - mx), 1e-5) << r;
    for (int64_t j = 0; j < V; ++j) {
      const double want = t < 0 ? 0.0 : scale * (std::exp(l[j] - mx) / sum - (j == t ? 1.0 : 0.0));
      EXPECT_NEAR(got[r * V + j], want, 1e-7) << r << " " << j;
    }
  }
}

}  // namespace
}  // namespace anvil::kernels
