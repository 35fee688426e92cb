// The per-element bodies the CPU layers and the CUDA kernels share
// (bodies.hpp), each against a double-precision reference or its own finite
// differences; and the row kernels as the GPU assembles them (a tree
// reduction per row, then the bodies) against the CPU layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "anvil/kernels/bodies.hpp"
#include "anvil/kernels/fast_math.hpp"
#include "anvil/kernels/layers.hpp"
#include "support/gradient_check.hpp"

namespace anvil::kernels {
namespace {

using test_support::random_vector;

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

TEST(Bodies, GeluAndItsSlopeMatchTheTanhFormula) {
  for (double x = -6.0; x <= 6.0; x += 0.0625) {
    const auto xf = static_cast<float>(x);
    EXPECT_NEAR(body::gelu(xf), gelu_ref(xf), 2e-6 * (1.0 + std::fabs(x))) << x;
    const double h = 1e-4;
    const double fd = (gelu_ref(xf + h) - gelu_ref(xf - h)) / (2 * h);
    EXPECT_NEAR(body::gelu_slope(xf), fd, 2e-5) << x;
  }
}

TEST(Bodies, SwigluGradientsMatchFiniteDifferences) {
  for (double g = -5.0; g <= 5.0; g += 0.25) {
    for (double u : {-1.5, 0.3, 2.0}) {
      const auto gf = static_cast<float>(g), uf = static_cast<float>(u);
      const double ref = g * sigmoid_ref(g) * u;
      EXPECT_NEAR(body::swiglu(gf, uf), ref, 2e-6 * (1.0 + std::fabs(ref)));
      const double d = 0.7, h = 1e-5;
      const double fd_g =
          d * ((g + h) * sigmoid_ref(g + h) - (g - h) * sigmoid_ref(g - h)) * u / (2 * h);
      float dg = 0, du = 0;
      body::swiglu_grads_add(gf, uf, static_cast<float>(d), &dg, &du);
      EXPECT_NEAR(dg, fd_g, 1e-5 * (1.0 + std::fabs(fd_g))) << g << " " << u;
      EXPECT_NEAR(du, d * g * sigmoid_ref(g), 1e-6 * (1.0 + std::fabs(g)));
    }
  }
}

TEST(Bodies, RopePairRotatesAndTheInverseUndoesIt) {
  const float theta = 10000.0f;
  for (int i = 0; i < 32; ++i)
    EXPECT_FLOAT_EQ(body::rope_inv_freq(i, 64, theta),
                    static_cast<float>(std::pow(10000.0, -2.0 * i / 64)));
  const float angle = 37.0f * body::rope_inv_freq(3, 64, theta);
  const float c = std::cos(angle), s = std::sin(angle);
  float a = 0.8f, b = -1.3f;
  body::rope_pair(&a, &b, c, s);
  EXPECT_NEAR(a, 0.8 * std::cos(angle) + 1.3 * std::sin(angle), 1e-6);
  EXPECT_NEAR(b, -1.3 * std::cos(angle) + 0.8 * std::sin(angle), 1e-6);
  body::rope_pair(&a, &b, c, -s);  // the backward's rotation
  EXPECT_NEAR(a, 0.8f, 1e-6);
  EXPECT_NEAR(b, -1.3f, 1e-6);
}

TEST(Bodies, AdamWMatchesTheTextbookUpdate) {
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, lr = 3e-3, wd = 0.1;
  float p = 0.5f, m = 0, v = 0;
  double pr = 0.5, mr = 0, vr = 0;
  const double grads[] = {0.3, -0.05, 0.2, 1e-4, -0.7};
  for (int t = 1; t <= 5; ++t) {
    const double g = grads[t - 1];
    const body::AdamWStep st{static_cast<float>(b1),
                             static_cast<float>(b2),
                             static_cast<float>(eps),
                             static_cast<float>(lr / (1 - std::pow(b1, t))),
                             static_cast<float>(std::sqrt(1 - std::pow(b2, t))),
                             static_cast<float>(1 - lr * wd)};
    body::adamw(&p, &m, &v, static_cast<float>(g), st);
    pr *= 1 - lr * wd;
    mr = b1 * mr + (1 - b1) * g;
    vr = b2 * vr + (1 - b2) * g * g;
    const double mhat = mr / (1 - std::pow(b1, t)), vhat = vr / (1 - std::pow(b2, t));
    pr -= lr * mhat / (std::sqrt(vhat) + eps);
    EXPECT_NEAR(p, pr, 1e-6) << "step " << t;
    EXPECT_NEAR(m, mr, 1e-7);
    EXPECT_NEAR(v, vr, 1e-8);
  }
}

// Muon's element-wise parts: heavy-ball momentum (Nesterov or plain) and the
// decayed update, against the formulas in double over a few steps.
TEST(Bodies, MuonMomentumAndUpdateMatchTheFormulas) {
  const double mu = 0.95, decay = 1 - 0.02 * 0.1, step = 0.02 * 0.2 * std::sqrt(768.0);
  for (const bool nesterov : {true, false}) {
    float buf = 0, p = 0.25f;
    double br = 0, pr = 0.25;
    const double grads[] = {0.3, -0.05, 0.2, 1e-4, -0.7};
    for (const double g : grads) {
      const float u =
          body::muon_momentum(&buf, static_cast<float>(g), static_cast<float>(mu), nesterov);
      br = mu * br + g;
      const double ur = nesterov ? g + mu * br : br;
      EXPECT_NEAR(buf, br, 1e-7);
      EXPECT_NEAR(u, ur, 1e-7) << (nesterov ? "nesterov" : "plain");
      body::muon_apply(&p, u, static_cast<float>(decay), static_cast<float>(step));
      pr = pr * decay - step * ur;
      EXPECT_NEAR(p, pr, 1e-6);
    }
  }
}

// Muon's start X = U / (|U|_F + 1e-7): unit norm for any scale of U, zero
// stays zero, a NaN norm gives NaN.
TEST(Bodies, MuonUnitFactorScalesToUnitNorm) {
  const std::vector<float> base = {0.3f, -1.25f, 2.0f, 1e-3f, -0.7f};
  for (const double s : {1e-6, 1e-2, 1.0, 3.5, 1e4}) {
    double norm2 = 0;
    for (float v : base) norm2 += (v * s) * (v * s);
    const float f = body::muon_unit_factor(std::sqrt(norm2));
    double unit2 = 0;
    for (float v : base) {
      const double x = static_cast<float>(v * s) * f;
      unit2 += x * x;
    }
    // |U| / (|U| + 1e-7) with the epsilon, within float rounding.
    const double norm = std::sqrt(norm2);
    EXPECT_NEAR(std::sqrt(unit2), norm / (norm + 1e-7), 1e-6) << s;
  }
  EXPECT_EQ(body::muon_unit_factor(0.0) * 0.0f, 0.0f);
  EXPECT_TRUE(std::isnan(body::muon_unit_factor(std::nan(""))));
}

TEST(Bodies, CrossEntropyGradientIsSoftmaxMinusTheTarget) {
  const std::vector<double> logits = {1.5, -0.3, 2.2, 0.0, -4.0, 0.7};
  const int target = 2;
  const double scale = 0.25;
  double mx = logits[0];
  for (double l : logits) mx = std::max(mx, l);
  double sum = 0;
  for (double l : logits) sum += std::exp(l - mx);
  const auto loss = [&](int j, double h) {
    double s = 0;
    for (size_t k = 0; k < logits.size(); ++k)
      s += std::exp(logits[k] + (static_cast<int>(k) == j ? h : 0.0));
    return scale * (std::log(s) - (logits[target] + (j == target ? h : 0.0)));
  };
  const auto inv = static_cast<float>(scale / sum);
  for (int j = 0; j < static_cast<int>(logits.size()); ++j) {
    const float e = fast_exp(static_cast<float>(logits[j] - mx));
    const float p = body::cross_entropy_dlogit(e, inv);
    const float got = j == target ? body::cross_entropy_target(p, static_cast<float>(scale)) : p;
    const double fd = (loss(j, 1e-5) - loss(j, -1e-5)) / 2e-5;
    EXPECT_NEAR(got, fd, 1e-6) << j;
  }
}

// The vectorised normal CDF against erfc in double, relative: within a
// millionth where |x| <= 2 (float's 1 + erf(x) path reaches 9e-7 there),
// and within the float rounding of x^2 / 2 further out: 3e-5 down to
// x = -12 (Phi ~ 2e-33), where 1 + erf(x) in float is 0.
TEST(FastMath, NormalCdfKeepsItsRelativeAccuracyInBothTails) {
  double worst_middle = 0.0, worst_tail = 0.0;
  for (int i = -16000; i <= 16000; ++i) {
    const float x = static_cast<float>(i) * 7.5e-4f;  // [-12, 12]
    const double want = 0.5 * std::erfc(-static_cast<double>(x) / std::sqrt(2.0));
    const double rel = std::abs(fast_normal_cdf(x) - want) / want;
    double& worst = std::abs(x) <= 2.0f ? worst_middle : worst_tail;
    worst = std::max(worst, rel);
  }
  EXPECT_LT(worst_middle, 1e-6);
  EXPECT_LT(worst_tail, 3e-5);
  EXPECT_EQ(fast_normal_cdf(40.0f), 1.0f);
  EXPECT_GE(fast_normal_cdf(-40.0f), 0.0f);
  EXPECT_LT(fast_normal_cdf(-40.0f), 1e-30f);
  EXPECT_TRUE(std::isnan(fast_normal_cdf(std::nanf(""))));
}

// A GPU block's reduction: pairwise halving over a power-of-two span, as
// the row kernels' shared-memory trees add.
float tree_sum(std::vector<float> v) {
  size_t n = 1;
  while (n < v.size()) n *= 2;
  v.resize(n, 0.0f);
  for (size_t half = n / 2; half >= 1; half /= 2)
    for (size_t i = 0; i < half; ++i) v[i] += v[i + half];
  return v[0];
}

TEST(Bodies, NormRowsAssembledAsOnTheGpuMatchTheCpuLayers) {
  const int64_t N = 4, C = 200;
  const auto x = random_vector(N * C, 11), w = random_vector(C, 12), b = random_vector(C, 13),
             d = random_vector(N * C, 14);
  const float eps = 1e-5f;
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  std::vector<float> rms_out(N * C), rms_rstd(N), rms_dx(N * C, 0.0f), rms_dw(C, 0.0f);
  rmsnorm_forward(rms_out.data(), rms_rstd.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_backward(rms_dx.data(), rms_dw.data(), d.data(), x.data(), w.data(), rms_rstd.data(), N,
                   C);
  const auto close = [](float got, float want) {
    EXPECT_NEAR(got, want, 2e-5f * (1.0f + std::fabs(want)));
  };
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.data() + n * C;
    const float* dr = d.data() + n * C;
    std::vector<float> t(xr, xr + C);
    const float m = tree_sum(t) / C;
    for (int64_t i = 0; i < C; ++i) t[i] = (xr[i] - m) * (xr[i] - m);
    const float s = 1.0f / std::sqrt(tree_sum(t) / C + eps);
    close(m, mean[n]);
    close(s, rstd[n]);
    std::vector<float> dn(C), dnn(C);
    for (int64_t i = 0; i < C; ++i) {
      close(body::layernorm(xr[i], m, s, w[i], b[i]), out[n * C + i]);
      dn[i] = w[i] * dr[i];
      dnn[i] = dn[i] * (xr[i] - m) * s;
    }
    const float dn_mean = tree_sum(dn) / C, dnn_mean = tree_sum(dnn) / C;
    for (int64_t i = 0; i < C; ++i)
      close(body::layernorm_dx(dn[i], (xr[i] - m) * s, dn_mean, dnn_mean, s), dx[n * C + i]);

    for (int64_t i = 0; i < C; ++i) t[i] = xr[i] * xr[i];
    const float rs = 1.0f / std::sqrt(tree_sum(t) / C + eps);
    close(rs, rms_rstd[n]);
    for (int64_t i = 0; i < C; ++i) t[i] = w[i] * dr[i] * xr[i] * rs;
    const float dot = tree_sum(t) / C;
    for (int64_t i = 0; i < C; ++i) {
      close(body::rmsnorm(xr[i], rs, w[i]), rms_out[n * C + i]);
      close(body::rmsnorm_dx(xr[i] * rs, w[i], dr[i], rs, dot), rms_dx[n * C + i]);
    }
  }
}

}  // namespace
}  // namespace anvil::kernels
