// Every layer's backward against central finite differences of its forward:
// the objective is sum(out * R) for a fixed random R, so dL/dout = R.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/tile_gemm.hpp"
#include "support/gradient_check.hpp"

namespace anvil::kernels {
namespace {

using test_support::expect_matches_finite_differences;
using test_support::random_vector;
using test_support::weighted_sum;

TEST(LayerGradients, LayerNormMatchesFiniteDifferences) {
  const int64_t N = 5, C = 24;
  auto x = random_vector(N * C, 1), w = random_vector(C, 2), b = random_vector(C, 3);
  const auto r = random_vector(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto objective = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      1e-5f);
    return weighted_sum(out, r);
  };
  objective();
  std::vector<float> dx(N * C), dw(C), db(C);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  expect_matches_finite_differences("dx", x, dx, objective);
  expect_matches_finite_differences("dweight", w, dw, objective);
  expect_matches_finite_differences("dbias", b, db, objective);
}

TEST(LayerGradients, RmsNormMatchesFiniteDifferences) {
  const int64_t N = 5, C = 24;
  auto x = random_vector(N * C, 1), w = random_vector(C, 2);
  const auto r = random_vector(N * C, 4);
  std::vector<float> out(N * C), rstd(N);
  auto objective = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    return weighted_sum(out, r);
  };
  objective();
  std::vector<float> dx(N * C), dw(C);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_matches_finite_differences("dx", x, dx, objective);
  expect_matches_finite_differences("dweight", w, dw, objective);
}

TEST(LayerGradients, LinearMatchesFiniteDifferences) {
  const int64_t N = 7, IC = 13, OC = 11;
  auto x = random_vector(N * IC, 1), w = random_vector(OC * IC, 2), b = random_vector(OC, 3);
  const auto r = random_vector(N * OC, 4);
  std::vector<float> out(N * OC);
  auto objective = [&] {
    linear_forward(out.data(), x.data(), w.data(), b.data(), N, IC, OC);
    return weighted_sum(out, r);
  };
  std::vector<float> dx(N * IC), dw(OC * IC), db(OC);
  linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, IC, OC);
  expect_matches_finite_differences("dx", x, dx, objective);
  expect_matches_finite_differences("dweight", w, dw, objective);
  expect_matches_finite_differences("dbias", b, db, objective);
}

// The three ways a backward stores: `add` sums into both gradients,
// `write` overwrites both, `write_input` overwrites the input's and adds to
// the weight's (its buffers may hold anything, NaN included, beforehand).
// Each is the add-into-zeros result bit for bit, plus what was added to.
TEST(LayerGradients, LinearAndActivationsStoreAsTheyAreTold) {
  const int64_t N = 33, IC = 40, OC = 24;
  const auto x = random_vector(N * IC, 1), w = random_vector(OC * IC, 2);
  const auto dy = random_vector(N * OC, 3), held = random_vector(OC * IC, 4);
  std::vector<float> dx0(N * IC, 0.0f), dw0(OC * IC, 0.0f);
  linear_backward(dx0.data(), dw0.data(), nullptr, dy.data(), x.data(), w.data(), N, IC, OC);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dx(N * IC, nan), dw(OC * IC, nan);
  linear_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, IC, OC, nullptr,
                  device::GemmBackend::automatic, GradStore::write);
  EXPECT_EQ(dx, dx0);
  EXPECT_EQ(dw, dw0);
  std::fill(dx.begin(), dx.end(), nan);
  dw = held;
  linear_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, IC, OC, nullptr,
                  device::GemmBackend::automatic, GradStore::write_input);
  EXPECT_EQ(dx, dx0);
  for (int64_t i = 0; i < OC * IC; ++i)
    EXPECT_NEAR(dw[i], held[i] + dw0[i], 1e-5f * (1 + std::abs(dw0[i]))) << i;

  const auto a = random_vector(N * IC, 5, 2.0f);
  std::vector<float> d0(N * IC, 0.0f), d(N * IC, nan);
  gelu_backward(d0.data(), a.data(), x.data(), N * IC);
  gelu_backward(d.data(), a.data(), x.data(), N * IC, GradStore::write_input);
  EXPECT_EQ(d, d0);
  const auto gu = random_vector(N * 2 * IC, 6, 2.0f);
  std::vector<float> s0(N * 2 * IC, 0.0f), s(N * 2 * IC, nan);
  swiglu_backward(s0.data(), x.data(), gu.data(), N, IC);
  swiglu_backward(s.data(), x.data(), gu.data(), N, IC, GradStore::write_input);
  EXPECT_EQ(s, s0);
}

TEST(LayerGradients, GeluAndSwigluMatchFiniteDifferences) {
  const int64_t N = 4, F = 17;
  auto x = random_vector(N * F, 1, 2.0f);
  const auto r = random_vector(N * F, 2);
  std::vector<float> out(N * F);
  auto gelu = [&] {
    gelu_forward(out.data(), x.data(), N * F);
    return weighted_sum(out, r);
  };
  std::vector<float> dx(N * F);
  gelu_backward(dx.data(), x.data(), r.data(), N * F);
  expect_matches_finite_differences("gelu", x, dx, gelu, 1e-3f);

  auto gu = random_vector(N * 2 * F, 3, 2.0f);
  auto swiglu = [&] {
    swiglu_forward(out.data(), gu.data(), N, F);
    return weighted_sum(out, r);
  };
  std::vector<float> dgu(N * 2 * F);
  swiglu_backward(dgu.data(), r.data(), gu.data(), N, F);
  expect_matches_finite_differences("swiglu", gu, dgu, swiglu, 1e-3f);
}

TEST(LayerGradients, EmbeddingMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, C = 6, V = 9;
  auto wte = random_vector(V * C, 1), wpe = random_vector(T * C, 2);
  const std::vector<int32_t> tokens = {3, 1, 3, 8, 0, 3, 3, 2, 1, 7};  // repeats accumulate
  const auto r = random_vector(B * T * C, 3);
  std::vector<float> out(B * T * C);
  auto objective = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, r);
  };
  std::vector<float> dwte(V * C), dwpe(T * C);
  embedding_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  expect_matches_finite_differences("dwte", wte, dwte, objective);
  expect_matches_finite_differences("dwpe", wpe, dwpe, objective);
}

TEST(LayerGradients, RopeBackwardIsTheInverseRotationsGradient) {
  const int64_t N = 6, T = 3, H = 2, D = 8, stride = 2 * H * D;  // rows wider than the heads
  for (int64_t rotary : {int64_t{8}, int64_t{4}}) {
    auto x = random_vector(N * stride, 1);
    const auto r = random_vector(N * stride, 2);
    auto objective = [&] {
      std::vector<float> y = x;
      rope_forward(y.data(), N, T, 5, H, D, rotary, stride, 10000.0f);
      return weighted_sum(y, r);
    };
    std::vector<float> dx = r;
    rope_backward(dx.data(), N, T, 5, H, D, rotary, stride, 10000.0f);
    expect_matches_finite_differences("rope", x, dx, objective);
  }
}

TEST(LayerGradients, GroupedQueryAttentionMatchesFiniteDifferences) {
  // T above the 64-key tile, so the online softmax crosses tiles.
  const int64_t B = 2, T = 70, Hq = 4, Hkv = 2, D = 8, Q = (Hq + 2 * Hkv) * D;
  auto qkv = random_vector(B * T * Q, 1);
  const auto r = random_vector(B * T * Hq * D, 2);
  std::vector<float> out(B * T * Hq * D), lse(B * Hq * T);
  auto objective = [&] {
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, Hq, Hkv, D);
    return weighted_sum(out, r);
  };
  objective();
  std::vector<float> dqkv(B * T * Q);
  attention_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), B, T, Hq, Hkv, D);
  expect_matches_finite_differences("dqkv", qkv, dqkv, objective);
}

// T = 300: three query/key blocks of the tile path, the last one partial, so
// the online softmax crosses blocks and the diagonal blocks are masked.
// The bf16 tiles are checked with tolerances for their bf16 probabilities
// against a reference that reads the inputs rounded to bf16 as they do.
struct AttentionTolerance {
  double out = 2e-6, grads = 2e-5, lse = 1e-5;
  bool bf16_inputs = false;
};

void expect_blocked_attention_matches_reference(AttentionTiles tiles, int64_t D,
                                                AttentionTolerance tol = {}, int64_t T = 300) {
  SCOPED_TRACE("D = " + std::to_string(D) + ", T = " + std::to_string(T));
  const int64_t B = 2, Hq = 4, Hkv = 2, Q = (Hq + 2 * Hkv) * D;
  const auto qkv = random_vector(B * T * Q, 7);
  const auto dout = random_vector(B * T * Hq * D, 8);
  auto input = [&](float x) { return tol.bf16_inputs ? to_float(to_bf16(x)) : x; };
  // dqkv starts as garbage: the backward writes every entry, it does not add.
  std::vector<float> out(B * T * Hq * D), lse(B * Hq * T), dqkv(B * T * Q, 1e3f);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, Hq, Hkv, D, tiles);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, Hq, Hkv, D,
                     tiles);
  // Reference: the T x T probabilities in double, then the textbook gradients.
  std::vector<double> ref_out(out.size(), 0.0), ref_d(dqkv.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      auto at = [&](int64_t t, int64_t off) {
        return static_cast<double>(input(qkv[(b * T + t) * Q + off]));
      };
      const int64_t qo = h * D, ko = (Hq + g) * D, vo = (Hq + Hkv + g) * D;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double sc = 0;
          for (int64_t d = 0; d < D; ++d) sc += at(t, qo + d) * at(j, ko + d);
          p[j] = sc * scale;
          mx = std::max(mx, p[j]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (auto& x : p) x /= sum;
        std::vector<double> go(D);
        for (int64_t d = 0; d < D; ++d) go[d] = input(dout[(b * T + t) * Hq * D + h * D + d]);
        double delta = 0;
        std::vector<double> o(D, 0.0);
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d) o[d] += p[j] * at(j, vo + d);
        for (int64_t d = 0; d < D; ++d) {
          ref_out[(b * T + t) * Hq * D + h * D + d] = o[d];
          delta += go[d] * o[d];
        }
        for (int64_t j = 0; j <= t; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += go[d] * at(j, vo + d);
          const double ds = p[j] * (dp - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            ref_d[(b * T + t) * Q + qo + d] += ds * at(j, ko + d);
            ref_d[(b * T + j) * Q + ko + d] += ds * at(t, qo + d);
            ref_d[(b * T + j) * Q + vo + d] += p[j] * go[d];
          }
        }
      }
    }
  }
  auto rel = [](const std::vector<float>& got, const std::vector<double>& want) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::abs(got[i] - want[i]));
      norm = std::max(norm, std::abs(want[i]));
    }
    return err / norm;
  };
  EXPECT_LT(rel(out, ref_out), tol.out);
  EXPECT_LT(rel(dqkv, ref_d), tol.grads);
  // The log-sum-exp of the last row of the first head, from the reference.
  double mx = -1e300, sum = 0;
  std::vector<double> sc(T);
  for (int64_t j = 0; j < T; ++j) {
    double x = 0;
    for (int64_t d = 0; d < D; ++d)
      x += static_cast<double>(input(qkv[(T - 1) * Q + d])) * input(qkv[j * Q + Hq * D + d]);
    mx = std::max(mx, sc[j] = x * scale);
  }
  for (double x : sc) sum += std::exp(x - mx);
  EXPECT_NEAR(lse[T - 1], mx + std::log(sum), tol.lse);
}

TEST(LayerGradients, BlockedAttentionMatchesADoubleReferenceAcrossBlocks) {
  for (int64_t D : {16, 64}) expect_blocked_attention_matches_reference(AttentionTiles::blas, D);
}

// The tile kernel's path (the default where the build has its AVX-512 form)
// against the same reference, whatever this process would pick; D = 24 is
// no whole number of AVX-512 vectors and takes the BLAS tiles there.
TEST(LayerGradients, TileKernelAttentionMatchesADoubleReferenceAcrossBlocks) {
  if (tile_gemm_lanes() == 0) GTEST_SKIP() << "this build has no tile kernel (no AVX2 + FMA)";
  for (int64_t D : {16, 24, 64, 128})
    expect_blocked_attention_matches_reference(AttentionTiles::kernel, D);
}

// The bf16 tiles (AVX512_BF16): inputs rounded to bf16 as the reference
// reads them, the probabilities P and dS rounded to bf16 for their products
// (the error left). T = 301 leaves an odd last block (odd rows and keys).
TEST(LayerGradients, Bf16TileAttentionMatchesABf16InputReferenceAcrossBlocks) {
  if (!tile_gemm_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 tile kernel on this CPU/build";
  AttentionTolerance tol;
  tol.out = 3e-3;
  tol.grads = 6e-3;
  tol.lse = 2e-6;
  tol.bf16_inputs = true;
  for (int64_t D : {16, 64, 128})
    for (int64_t T : {300, 301})
      expect_blocked_attention_matches_reference(AttentionTiles::bf16, D, tol, T);
}

// Context parallelism's view of attention: the sequence cut into 2C chunks,
// each chunk's queries against the key prefix it may see (the chunks a rank
// of C holds under the head-tail layout), dK/dV added into one buffer over
// all chunks. Against the packed call over the whole sequence: exactly
// equal where the chunks start at multiples of the 128-key blocks (the
// same tiles in the same order; dK/dV are summed over the chunks in another
// order), within rounding where they do not.
void expect_chunked_attention_matches_packed(AttentionTiles tiles, int64_t T, int64_t chunks,
                                             int64_t D) {
  const int64_t B = 2, Hq = 4, Hkv = 2, Q = (Hq + 2 * Hkv) * D, S = T / chunks;
  const auto qkv = random_vector(B * T * Q, 17);
  const auto dout = random_vector(B * T * Hq * D, 18);
  std::vector<float> out(B * T * Hq * D), lse(B * Hq * T), dqkv(B * T * Q);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, Hq, Hkv, D, tiles);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, Hq, Hkv, D,
                     tiles);
  std::vector<float> c_out(out.size(), 7.0f), c_dqkv(dqkv.size(), 0.0f), c_lse(S * B * Hq);
  double out_err = 0, dq_err = 0, lse_err = 0, scale = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    AttentionView a;
    a.B = B;
    a.Tq = S;
    a.q0 = c * S;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.D = D;
    a.q = qkv.data() + c * S * Q;
    a.q_row = Q;
    a.q_batch = T * Q;
    a.k = qkv.data() + Hq * D;
    a.v = qkv.data() + (Hq + Hkv) * D;
    a.kv_row = Q;
    a.kv_batch = T * Q;
    a.out = c_out.data() + c * S * Hq * D;
    a.out_row = Hq * D;
    a.out_batch = T * Hq * D;
    a.lse = c_lse.data();
    attention_forward(a, tiles);
    AttentionGrads g{c_dqkv.data() + c * S * Q,        Q,  T * Q, c_dqkv.data() + Hq * D,
                     c_dqkv.data() + (Hq + Hkv) * D, Q, T * Q, true};
    attention_backward(a, dout.data() + c * S * Hq * D, g, tiles);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t t = 0; t < S; ++t)
          lse_err = std::max(lse_err, std::abs(static_cast<double>(c_lse[(b * Hq + h) * S + t]) -
                                               lse[(b * Hq + h) * T + c * S + t]));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out_err = std::max(out_err, std::abs(static_cast<double>(c_out[i]) - out[i]));
    scale = std::max(scale, std::abs(static_cast<double>(out[i])));
  }
  double kv_err = 0, g_scale = 0;
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t j = 0; j < Q; ++j) {
      const double d = std::abs(static_cast<double>(c_dqkv[n * Q + j]) - dqkv[n * Q + j]);
      g_scale = std::max(g_scale, std::abs(static_cast<double>(dqkv[n * Q + j])));
      (j < Hq * D ? dq_err : kv_err) = std::max(j < Hq * D ? dq_err : kv_err, d);
    }
  }
  const std::string what = "T " + std::to_string(T) + ", " + std::to_string(chunks) +
                           " chunks, D " + std::to_string(D) + ", " +
                           attention_tiles_description(tiles);
  if (S % 128 == 0) {
    EXPECT_EQ(out_err, 0.0) << what;
    EXPECT_EQ(lse_err, 0.0) << what;
    EXPECT_EQ(dq_err, 0.0) << what;
  }
  // Other chunk starts pair other rows on the bf16 tiles: the same exact
  // products summed in another order, and a probability whose fp32 value
  // moved by an ulp may round to a neighbouring bf16.
  const double tol = tiles == AttentionTiles::bf16 ? 2e-3 : 1e-6;
  EXPECT_LE(out_err, tol * scale) << what;
  EXPECT_LE(lse_err, 1e-5) << what;
  EXPECT_LE(dq_err, tol * g_scale) << what;
  EXPECT_LE(kv_err, tol * g_scale) << what;
}

TEST(LayerGradients, AttentionOverSequenceChunksMatchesTheWholeSequence) {
  std::vector<AttentionTiles> paths = {AttentionTiles::blas};
  if (tile_gemm_lanes() != 0) paths.push_back(AttentionTiles::kernel);
  if (tile_gemm_bf16_available()) paths.push_back(AttentionTiles::bf16);
  for (const AttentionTiles tiles : paths) {
    expect_chunked_attention_matches_packed(tiles, 512, 4, 16);   // aligned chunks
    expect_chunked_attention_matches_packed(tiles, 300, 4, 16);   // chunks of 75
    expect_chunked_attention_matches_packed(tiles, 96, 8, 32);    // chunks of 12
    expect_chunked_attention_matches_packed(tiles, 1024, 4, 64);  // aligned, 2 blocks each
  }
}

TEST(LayerGradients, AttentionIsCausalAndDecodeMatchesTheFullPass) {
  const int64_t T = 70, Hq = 4, Hkv = 2, D = 8, Q = (Hq + 2 * Hkv) * D;
  auto qkv = random_vector(T * Q, 1);
  std::vector<float> out(T * Hq * D), lse(Hq * T);
  attention_forward(out.data(), lse.data(), qkv.data(), 1, T, Hq, Hkv, D);
  std::vector<float> kc(T * Hkv * D), vc(T * Hkv * D), one(Hq * D);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < Hkv * D; ++i) {
      kc[t * Hkv * D + i] = qkv[t * Q + Hq * D + i];
      vc[t * Hkv * D + i] = qkv[t * Q + (Hq + Hkv) * D + i];
    }
    attention_decode(one.data(), &qkv[t * Q], kc.data(), vc.data(), t + 1, Hq, Hkv, D);
    for (int64_t i = 0; i < Hq * D; ++i) EXPECT_NEAR(one[i], out[t * Hq * D + i], 1e-5);
  }
  // Changing the last token's keys and values leaves earlier outputs alone.
  std::vector<float> changed = qkv, out2(out.size());
  for (int64_t i = Hq * D; i < Q; ++i) changed[(T - 1) * Q + i] += 1.0f;
  attention_forward(out2.data(), lse.data(), changed.data(), 1, T, Hq, Hkv, D);
  for (int64_t i = 0; i < (T - 1) * Hq * D; ++i) EXPECT_EQ(out2[i], out[i]);
}

TEST(LayerGradients, ClassifierLossMatchesFiniteDifferencesAcrossChunks) {
  const int64_t N = 9, C = 6, V = 11, chunk = 4;
  auto x = random_vector(N * C, 1), w = random_vector(V * C, 2);
  const std::vector<int32_t> targets = {1, 0, -1, 10, 5, 5, -1, 3, 7};
  std::vector<float> scratch(chunk * V);
  auto objective = [&] {
    int64_t scored = 0;
    return classifier_loss(nullptr, nullptr, x.data(), w.data(), targets.data(), N, C, V,
                           scratch.data(), chunk, &scored, 0.0f) /
           7.0;
  };
  int64_t scored = 0;
  std::vector<float> dx(N * C), dw(V * C);
  const double loss = classifier_loss(dx.data(), dw.data(), x.data(), w.data(), targets.data(), N,
                                      C, V, scratch.data(), chunk, &scored, 1.0f / 7.0f);
  EXPECT_EQ(scored, 7);
  EXPECT_NEAR(loss / 7.0, objective(), 1e-9);
  expect_matches_finite_differences("dx", x, dx, objective, 1e-2f, 1e-2);
  expect_matches_finite_differences("dweight", w, dw, objective, 1e-2f, 1e-2);
}

// The bf16 path must compute exactly the fp32 product of bf16-rounded
// inputs (fp32 accumulation), so it is compared with that, not with a
// tolerance for rounding.
std::vector<float> rounded_to_bf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = to_float(to_bf16(v[i]));
  return r;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  EXPECT_LE(worst, 1e-5 * scale) << what;
}

TEST(MixedPrecision, Bf16LinearIsTheFp32ProductOfBf16RoundedInputs) {
  const int64_t N = 37, IC = 70, OC = 45;
  const auto x = random_vector(N * IC, 1), w = random_vector(OC * IC, 2),
             d = random_vector(N * OC, 3);
  std::vector<bf16> w16(OC * IC), a(N * std::max(IC, OC)), b(N * std::max(IC, OC));
  convert_to_bf16(w16.data(), w.data(), OC * IC);
  for (int64_t i = 0; i < OC * IC; ++i) EXPECT_EQ(w16[i].bits, to_bf16(w[i]).bits);
  Bf16Scratch scratch{a.data(), b.data(), static_cast<int64_t>(a.size())};
  const auto xr = rounded_to_bf16(x), wr = rounded_to_bf16(w), dr = rounded_to_bf16(d);
  std::vector<float> ref(N * OC), y16(N * OC);
  linear_forward(ref.data(), xr.data(), wr.data(), nullptr, N, IC, OC);
  linear_forward(y16.data(), x.data(), MatmulWeight(w.data(), w16.data()), nullptr, N, IC, OC,
                 &scratch);
  expect_close(y16, ref, "forward");
  std::vector<float> dx_ref(N * IC), dw_ref(OC * IC), dx16(N * IC), dw16(OC * IC);
  linear_backward(dx_ref.data(), dw_ref.data(), nullptr, dr.data(), xr.data(), wr.data(), N, IC,
                  OC);
  linear_backward(dx16.data(), dw16.data(), nullptr, d.data(), x.data(),
                  MatmulWeight(w.data(), w16.data()), N, IC, OC, &scratch);
  expect_close(dx16, dx_ref, "dinp");
  expect_close(dw16, dw_ref, "dweight");
  Bf16Scratch small{a.data(), b.data(), 10};
  EXPECT_THROW(linear_forward(y16.data(), x.data(), MatmulWeight(w.data(), w16.data()), nullptr, N,
                              IC, OC, &small),
               std::logic_error);
}

// bf16: the weight gradient of kClassifierWgradChunks chunks is one GEMM over
// their rows, kept side by side in the scratch; with chunks of 2, 19 rows make
// groups of 8, 8 and 3 (the last chunk ragged). Against the fp32 classifier on
// the bf16-rounded inputs: the bf16 path also rounds the dlogits, so a
// tolerance of 1% of the largest entry (a misplaced row is off by far more).
TEST(MixedPrecision, Bf16ClassifierGradientsOverChunkGroupsMatchFp32) {
  const int64_t N = 19, C = 6, V = 11, chunk = 2;
  ASSERT_EQ(classifier_wgrad_rows(chunk, N), 8);
  const auto x = random_vector(N * C, 4), w = random_vector(V * C, 5);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = i == 5 ? -1 : static_cast<int32_t>((i * 7) % V);
  std::vector<bf16> w16(V * C), a(8 * V), b(8 * V);
  convert_to_bf16(w16.data(), w.data(), V * C);
  Bf16Scratch low{a.data(), b.data(), static_cast<int64_t>(a.size())};
  const auto xr = rounded_to_bf16(x), wr = rounded_to_bf16(w);
  std::vector<float> scratch(chunk * V), dx_ref(N * C), dw_ref(V * C), dx16(N * C), dw16(V * C);
  int64_t scored = 0;
  const double ref = classifier_loss(dx_ref.data(), dw_ref.data(), xr.data(), wr.data(),
                                     targets.data(), N, C, V, scratch.data(), chunk, &scored, 0.5f);
  const double got =
      classifier_loss(dx16.data(), dw16.data(), x.data(), MatmulWeight(w.data(), w16.data()),
                      targets.data(), N, C, V, scratch.data(), chunk, &scored, 0.5f, &low);
  EXPECT_EQ(scored, N - 1);
  EXPECT_NEAR(got, ref, 1e-4 * std::abs(ref));
  auto expect_within = [](const std::vector<float>& a, const std::vector<float>& b,
                          const char* what) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    }
    EXPECT_LE(worst, 1e-2 * scale) << what;
  };
  expect_within(dx16, dx_ref, "dx");
  expect_within(dw16, dw_ref, "dweight");
  Bf16Scratch small{a.data(), b.data(), 2 * V};  // a chunk's rows, not a group's
  EXPECT_THROW(
      classifier_loss(dx16.data(), dw16.data(), x.data(), MatmulWeight(w.data(), w16.data()),
                      targets.data(), N, C, V, scratch.data(), chunk, &scored, 0.5f, &small),
      std::logic_error);
}

// zero and copy_rows on both sides of the parallel threshold, with odd sizes
// (the threads' cuts round to cache lines), touch exactly their ranges.
TEST(Memory, ZeroAndCopyRowsTouchExactlyTheirRanges) {
  for (const int64_t n : {int64_t{1}, int64_t{1000}, kParallelBytes / 4 - 1,
                          kParallelBytes / 4 + 17, int64_t{3} * kParallelBytes / 4 + 5}) {
    std::vector<float> v(static_cast<size_t>(n) + 2, 7.0f);
    zero(v.data() + 1, n);
    EXPECT_EQ(v.front(), 7.0f);
    EXPECT_EQ(v.back(), 7.0f);
    EXPECT_TRUE(std::all_of(v.begin() + 1, v.end() - 1, [](float x) { return x == 0.0f; })) << n;
  }
  std::vector<unsigned char> b(kParallelBytes + 131, 9);
  zero_bytes(b.data() + 3, static_cast<int64_t>(b.size()) - 5);
  EXPECT_EQ(b[2], 9);
  EXPECT_EQ(b[b.size() - 2], 9);
  EXPECT_EQ(std::count(b.begin(), b.end(), 0), static_cast<long>(b.size()) - 5);
  for (const int64_t rows : {int64_t{3}, int64_t{4099}}) {
    const int64_t cols = 37, src_stride = 50, dst_stride = 41;
    const std::vector<float> src = random_vector(static_cast<size_t>(rows * src_stride), 5);
    std::vector<float> dst(static_cast<size_t>(rows * dst_stride), -1.0f);
    copy_rows(dst.data(), dst_stride, src.data(), src_stride, rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < dst_stride; ++c)
        ASSERT_EQ(dst[r * dst_stride + c], c < cols ? src[r * src_stride + c] : -1.0f)
            << r << "," << c;
  }
}

}  // namespace
}  // namespace anvil::kernels
