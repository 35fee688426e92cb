// CCA's convolutions, mean skip path and L2 norm against finite differences,
// and the convolution against a direct reading of docs/zaya1-spec.md's formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "anvil/kernels/cca.hpp"
#include "support/gradient_check.hpp"

namespace anvil::kernels {
namespace {

using test_support::random_vector;
using test_support::weighted_sum;

void expect_fd(const char* what, std::vector<float>& x, const std::vector<float>& grad,
               const std::function<double()>& objective) {
  test_support::expect_matches_finite_differences(what, x, grad, objective, 1e-2f, 2e-2, 150);
}

TEST(Cca, ConvolutionsFollowTheSpecIncludingTheBiasEdge) {
  const int64_t B = 2, S = 4, C = 6, G = 3;  // 2 groups of 3 channels
  const auto u = random_vector(B * S * C, 1), w0 = random_vector(C * 2, 2),
             b0 = random_vector(C, 3), w1 = random_vector(C * G * 2, 4), b1 = random_vector(C, 5);
  std::vector<float> conv(B * S * C), D(B * S * C);
  cca_conv_forward(conv.data(), D.data(), u.data(), w0.data(), b0.data(), w1.data(), b1.data(), B,
                   S, C, G);
  auto U = [&](int64_t b, int64_t t, int64_t c) { return t < 0 ? 0.0 : u[(b * S + t) * C + c]; };
  auto Dref = [&](int64_t b, int64_t t, int64_t c) {  // t >= -1: D_{-1} = b0
    return w0[2 * c] * U(b, t - 1, c) + w0[2 * c + 1] * U(b, t, c) + b0[c];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = b1[c];
        for (int64_t j = 0; j < G; ++j) {
          const int64_t k = c / G * G + j;
          s += w1[(c * G + j) * 2] * Dref(b, t - 1, k) + w1[(c * G + j) * 2 + 1] * Dref(b, t, k);
        }
        EXPECT_NEAR(conv[(b * S + t) * C + c], s, 1e-5) << b << " " << t << " " << c;
      }
}

// Also on 150 rows: the channel sums run in blocks of 64 rows, which here
// cut through sequences (the previous-row term must not cross a sequence).
TEST(Cca, ConvolutionBackwardMatchesFiniteDifferences) {
  for (const auto& [B, S] : {std::pair<int64_t, int64_t>{2, 5}, {3, 50}}) {
    const int64_t C = 8, G = 4;
    auto u = random_vector(B * S * C, 1), w0 = random_vector(C * 2, 2), b0 = random_vector(C, 3),
         w1 = random_vector(C * G * 2, 4), b1 = random_vector(C, 5);
    const auto r = random_vector(B * S * C, 6);
    std::vector<float> conv(B * S * C), D(B * S * C);
    auto objective = [&] {
      cca_conv_forward(conv.data(), D.data(), u.data(), w0.data(), b0.data(), w1.data(), b1.data(),
                       B, S, C, G);
      return weighted_sum(conv, r);
    };
    objective();
    std::vector<float> du(u.size()), dw0(w0.size()), db0(b0.size()), dw1(w1.size()), db1(b1.size());
    std::vector<float> scratch(u.size(), 7.0f);  // garbage in: backward must overwrite it
    cca_conv_backward(du.data(), dw0.data(), db0.data(), dw1.data(), db1.data(), scratch.data(),
                      r.data(), u.data(), D.data(), w0.data(), b0.data(), w1.data(), B, S, C, G);
    expect_fd("du", u, du, objective);
    expect_fd("dw0", w0, dw0, objective);
    expect_fd("db0 (incl. the D_{-1} edge)", b0, db0, objective);
    expect_fd("dw1", w1, dw1, objective);
    expect_fd("db1", b1, db1, objective);
  }
}

// Context parallelism cuts a sequence into chunks: each chunk's
// convolutions, continued from the two rows before it (the halo; zeros for
// the first chunk), give the whole sequence's rows, and the chunks' weight
// gradients plus the halo gradients handed back give the whole backward.
TEST(Cca, ConvolutionOverChunksWithAHaloMatchesTheWholeSequence) {
  const int64_t B = 2, chunks = 3, S = 5, T = chunks * S, C = 8, G = 4;
  const auto u = random_vector(B * T * C, 1), w0 = random_vector(C * 2, 2),
             b0 = random_vector(C, 3), w1 = random_vector(C * G * 2, 4), b1 = random_vector(C, 5);
  const auto r = random_vector(B * T * C, 6);
  std::vector<float> conv(B * T * C), D(B * T * C), scratch(B * T * C);
  cca_conv_forward(conv.data(), D.data(), u.data(), w0.data(), b0.data(), w1.data(), b1.data(), B,
                   T, C, G);
  std::vector<float> du(u.size()), dw0(w0.size()), db0(b0.size()), dw1(w1.size()), db1(b1.size());
  cca_conv_backward(du.data(), dw0.data(), db0.data(), dw1.data(), db1.data(), scratch.data(),
                    r.data(), u.data(), D.data(), w0.data(), b0.data(), w1.data(), B, T, C, G);
  std::vector<float> c_du(u.size()), c_dw0(w0.size()), c_db0(b0.size()), c_dw1(w1.size()),
      c_db1(b1.size());
  double conv_err = 0, conv_scale = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    // This chunk's rows of every sequence, and the two rows before them.
    std::vector<float> cu(B * S * C), cr(B * S * C), halo(B * 2 * C, 0.0f), dhalo(B * 2 * C, 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(&u[(b * T + k * S) * C], S * C, &cu[b * S * C]);
      std::copy_n(&r[(b * T + k * S) * C], S * C, &cr[b * S * C]);
      if (k > 0) std::copy_n(&u[(b * T + k * S - 2) * C], 2 * C, &halo[b * 2 * C]);
    }
    std::vector<float> cconv(B * S * C), cD(B * S * C), cscratch(B * S * C), cdu(B * S * C, 0.0f);
    cca_conv_forward(cconv.data(), cD.data(), cu.data(), w0.data(), b0.data(), w1.data(),
                     b1.data(), B, S, C, G, halo.data());
    cca_conv_backward(cdu.data(), c_dw0.data(), c_db0.data(), c_dw1.data(), c_db1.data(),
                      cscratch.data(), cr.data(), cu.data(), cD.data(), w0.data(), b0.data(),
                      w1.data(), B, S, C, G, halo.data(), dhalo.data());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < S * C; ++i) {
        conv_err = std::max(conv_err, std::abs(static_cast<double>(cconv[b * S * C + i]) -
                                               conv[(b * T + k * S) * C + i]));
        conv_scale = std::max(conv_scale, std::abs(static_cast<double>(conv[i])));
        c_du[(b * T + k * S) * C + i] += cdu[b * S * C + i];
      }
      if (k > 0)
        for (int64_t i = 0; i < 2 * C; ++i) c_du[(b * T + k * S - 2) * C + i] += dhalo[b * 2 * C + i];
    }
  }
  EXPECT_LE(conv_err, 1e-6 * conv_scale);
  auto rel = [](const std::vector<float>& got, const std::vector<float>& want) {
    double err = 0, scale = 1e-30;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    return err / scale;
  };
  EXPECT_LE(rel(c_du, du), 1e-6) << "du with the halo gradients";
  EXPECT_LE(rel(c_dw0, dw0), 1e-6) << "dw0";
  EXPECT_LE(rel(c_db0, db0), 1e-6) << "db0";
  EXPECT_LE(rel(c_dw1, dw1), 1e-6) << "dw1";
  EXPECT_LE(rel(c_db1, db1), 1e-6) << "db1";
}

TEST(Cca, MeanSkipPathMatchesTheSpecAndFiniteDifferences) {
  const int64_t N = 3, Hq = 4, Hkv = 2, D = 5, g = Hq / Hkv;
  const int64_t qk_stride = (Hq + Hkv) * D, out_stride = (Hq + Hkv) * D + 3;
  auto qkp = random_vector(N * qk_stride, 1);  // rows [qp | kp]
  auto conv = random_vector(N * (Hq + Hkv) * D, 2);
  const auto r = random_vector(N * out_stride, 3);
  std::vector<float> out(N * out_stride);
  auto objective = [&] {
    cca_mean_skip_forward(out.data(), out.data() + Hq * D, out_stride, qkp.data(),
                          qkp.data() + Hq * D, qk_stride, conv.data(), N, Hq, Hkv, D);
    return weighted_sum(out, r);
  };
  objective();
  // The spec, literally, for one entry: k[1][2] of row 2.
  double mean = 0;
  for (int64_t a = 0; a < g; ++a) {
    mean += 0.5 * (qkp[2 * qk_stride + (g + a) * D + 2] + qkp[2 * qk_stride + Hq * D + D + 2]);
  }
  EXPECT_NEAR(out[2 * out_stride + Hq * D + D + 2],
              conv[2 * (Hq + Hkv) * D + Hq * D + D + 2] + mean / g, 1e-5);
  std::vector<float> dqkp(qkp.size()), dconv(conv.size());
  cca_mean_skip_backward(dqkp.data(), dqkp.data() + Hq * D, dconv.data(), r.data(),
                         r.data() + Hq * D, out_stride, qk_stride, N, Hq, Hkv, D);
  expect_fd("dqp/dkp", qkp, dqkp, objective);
  expect_fd("dconv", conv, dconv, objective);
}

TEST(Cca, HeadL2NormWithTemperatureMatchesFiniteDifferences) {
  const int64_t N = 4, H = 2, D = 8, stride = H * D + 2;
  auto x = random_vector(N * stride, 1), temp = random_vector(H, 2);
  const auto r = random_vector(N * stride, 3);
  std::vector<float> y(N * stride), norms(N * H);
  auto objective = [&] {
    l2norm_heads_forward(y.data(), norms.data(), x.data(), temp.data(), N, H, D, stride);
    double s = 0;  // only the heads' columns count (the padding is not written)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * D; ++i)
        s += static_cast<double>(y[n * stride + i]) * r[n * stride + i];
    return s;
  };
  objective();
  double len = 0;
  for (int64_t i = 0; i < D; ++i) len += y[i] * y[i];
  EXPECT_NEAR(std::sqrt(len), std::sqrt(static_cast<double>(D)) * std::abs(temp[0]), 1e-4);
  std::vector<float> dx(x.size()), dtemp(H), rr = r;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = H * D; i < stride; ++i) rr[n * stride + i] = 0;
  l2norm_heads_backward(dx.data(), dtemp.data(), rr.data(), x.data(), norms.data(), temp.data(), N,
                        H, D, stride);
  expect_fd("dx", x, dx, objective);
  expect_fd("dtemp", temp, dtemp, objective);
}

}  // namespace
}  // namespace anvil::kernels
