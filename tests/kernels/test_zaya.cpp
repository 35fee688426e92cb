// Residual scaling, exact GELU and router selection against finite
// differences and their definitions (docs/zaya1-spec.md sections 4 and 5).
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "anvil/kernels/zaya.hpp"
#include "support/gradient_check.hpp"

namespace anvil::kernels {
namespace {

using test_support::random_vector;
using test_support::weighted_sum;

void expect_fd(const char* what, std::vector<float>& x, const std::vector<float>& grad,
               const std::function<double()>& objective, float h = 1e-2f) {
  test_support::expect_matches_finite_differences(what, x, grad, objective, h, 2e-2, x.size());
}

TEST(Zaya, ResidualMergeMatchesFiniteDifferencesWithAndWithoutResidual) {
  const int64_t N = 5, C = 7;
  auto r = random_vector(N * C, 1), h = random_vector(N * C, 2), hs = random_vector(C, 3),
       hb = random_vector(C, 4), rs = random_vector(C, 5), rb = random_vector(C, 6);
  const auto w = random_vector(N * C, 7);
  std::vector<float> out(N * C);
  for (bool first : {false, true}) {
    auto objective = [&] {
      residual_merge_forward(out.data(), first ? nullptr : r.data(), h.data(), hs.data(), hb.data(),
                             rs.data(), rb.data(), N, C);
      return weighted_sum(out, w);
    };
    objective();
    EXPECT_NEAR(out[3], (h[3] + hb[3]) * hs[3] + (first ? 0.0f : (r[3] + rb[3]) * rs[3]), 1e-6);
    std::vector<float> dr(N * C), dh(N * C), dhs(C), dhb(C), drs(C), drb(C);
    residual_merge_backward(dr.data(), dh.data(), dhs.data(), dhb.data(), drs.data(), drb.data(),
                            w.data(), first ? nullptr : r.data(), h.data(), hs.data(), hb.data(),
                            rs.data(), rb.data(), N, C);
    expect_fd("dh", h, dh, objective);
    expect_fd("dhs", hs, dhs, objective);
    expect_fd("dhb", hb, dhb, objective);
    if (!first) {
      expect_fd("dr", r, dr, objective);
      expect_fd("drs", rs, drs, objective);
      expect_fd("drb", rb, drb, objective);
    }
  }
}

// Many rows (several of the kernel's row blocks, the last one partial):
// every gradient against a double reference, and the same bits on 1 and 2
// threads (the blocks, not the threads, fix the summation order).
TEST(Zaya, ResidualMergeBackwardMatchesADoubleReferenceOnAnyThreadCount) {
  const int64_t N = 300, C = 37;
  auto r = random_vector(N * C, 1), h = random_vector(N * C, 2), hs = random_vector(C, 3),
       hb = random_vector(C, 4), rs = random_vector(C, 5), rb = random_vector(C, 6);
  const auto d = random_vector(N * C, 7);
  std::vector<double> want_hs(C), want_hb(C), want_rs(C), want_rb(C);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const double g = d[n * C + c];
      want_hs[c] += g * (static_cast<double>(h[n * C + c]) + hb[c]);
      want_hb[c] += g * hs[c];
      want_rs[c] += g * (static_cast<double>(r[n * C + c]) + rb[c]);
      want_rb[c] += g * rs[c];
    }
  }
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2}) {
    std::vector<float> dr(N * C, 0.5f), dh(N * C, -0.25f), dhs(C), dhb(C), drs(C), drb(C);
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    residual_merge_backward(dr.data(), dh.data(), dhs.data(), dhb.data(), drs.data(), drb.data(),
                            d.data(), r.data(), h.data(), hs.data(), hb.data(), rs.data(),
                            rb.data(), N, C);
    omp_set_num_threads(before);
    for (int64_t i = 0; i < N * C; ++i) {
      ASSERT_FLOAT_EQ(dh[i], -0.25f + d[i] * hs[i % C]) << i;
      ASSERT_FLOAT_EQ(dr[i], 0.5f + d[i] * rs[i % C]) << i;
    }
    for (int64_t c = 0; c < C; ++c) {
      for (const auto& [got, want] :
           {std::pair{dhs[c], want_hs[c]}, std::pair{dhb[c], want_hb[c]},
            std::pair{drs[c], want_rs[c]}, std::pair{drb[c], want_rb[c]}}) {
        EXPECT_NEAR(got, want, 1e-5 * (1 + std::abs(want))) << "channel " << c;
      }
    }
    std::vector<float> all = dhs;
    for (const auto* v : {&dhb, &drs, &drb, &dh, &dr}) all.insert(all.end(), v->begin(), v->end());
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  // Written over NaNs: the add into zeros' bits; the scales' sums still add.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dr0(N * C, 0.0f), dh0(N * C, 0.0f), dr(N * C, nan), dh(N * C, nan);
  std::vector<float> s0(4 * C, 0.0f), s1(4 * C, 0.0f);
  residual_merge_backward(dr0.data(), dh0.data(), s0.data(), s0.data() + C, s0.data() + 2 * C,
                          s0.data() + 3 * C, d.data(), r.data(), h.data(), hs.data(), hb.data(),
                          rs.data(), rb.data(), N, C);
  residual_merge_backward(dr.data(), dh.data(), s1.data(), s1.data() + C, s1.data() + 2 * C,
                          s1.data() + 3 * C, d.data(), r.data(), h.data(), hs.data(), hb.data(),
                          rs.data(), rb.data(), N, C, GradStore::write_input);
  EXPECT_EQ(dr, dr0);
  EXPECT_EQ(dh, dh0);
  EXPECT_EQ(s1, s0);
}

TEST(Zaya, ExactGeluMatchesItsDefinitionAndFiniteDifferences) {
  auto x = random_vector(50, 1, 2.0f);
  const auto w = random_vector(50, 2);
  std::vector<float> out(50);
  auto objective = [&] {
    gelu_erf_forward(out.data(), x.data(), 50);
    return weighted_sum(out, w);
  };
  objective();
  for (int i = 0; i < 50; ++i) {
    EXPECT_NEAR(out[i], 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0))), 1e-6);
  }
  std::vector<float> dx(50);
  gelu_erf_backward(dx.data(), x.data(), w.data(), 50);
  expect_fd("gelu_erf", x, dx, objective, 1e-3f);
}

TEST(Zaya, RouterSelectsWithTheBiasButGatesWithoutIt) {
  const int64_t classes = 4;  // 3 experts + skip
  // Row 0: expert 1 is likeliest; a bias of -1 on it and +0.5 on skip moves the choice to skip.
  const std::vector<float> logits = {0.0f, 2.0f, 0.5f, 0.1f};
  const std::vector<float> none = {0, 0, 0, 0}, steer = {0, -1.0f, 0, 0.5f};
  int32_t choice = -1;
  float gate = 0;
  std::vector<float> probs(classes);
  router_select_forward(&choice, &gate, probs.data(), logits.data(), none.data(), 1, classes);
  EXPECT_EQ(choice, 1);
  EXPECT_FLOAT_EQ(gate, probs[1]);
  router_select_forward(&choice, &gate, probs.data(), logits.data(), steer.data(), 1, classes);
  EXPECT_EQ(choice, 3);             // skip
  EXPECT_FLOAT_EQ(gate, probs[3]);  // the unbiased probability
}

TEST(Zaya, RouterGateGradientMatchesFiniteDifferencesAtAFixedChoice) {
  const int64_t N = 6, classes = 5;
  auto logits = random_vector(N * classes, 1);
  const auto bias = random_vector(classes, 2, 0.1f);
  const auto w = random_vector(N, 3);
  std::vector<int32_t> choice(N);
  std::vector<float> gate(N), probs(N * classes);
  router_select_forward(choice.data(), gate.data(), probs.data(), logits.data(), bias.data(), N,
                        classes);
  const auto fixed = choice;
  auto objective = [&] {  // the gate of the choice made at the unperturbed point
    std::vector<int32_t> c(N);
    router_select_forward(c.data(), gate.data(), probs.data(), logits.data(), bias.data(), N,
                          classes);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += w[n] * probs[n * classes + fixed[n]];
    return s;
  };
  std::vector<float> dlogits(N * classes);
  router_select_backward(dlogits.data(), w.data(), choice.data(), probs.data(), N, classes);
  expect_fd("dlogits", logits, dlogits, objective, 1e-3f);
}

TEST(Zaya, RouterLossesMatchTheirDefinitionAndFiniteDifferences) {
  const int64_t N = 7, E = 4, K = E + 1;
  auto logits = random_vector(N * K, 4, 2.0f);
  const std::vector<int64_t> routed = {3, 0, 2, 1};  // 1 token to skip; fixed, as in the loss
  const float aux = 0.3f, z = 0.05f, scale = 0.5f;
  std::vector<float> probs(N * K);
  auto softmax = [&] {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += std::exp(static_cast<double>(logits[n * K + k]));
      for (int64_t k = 0; k < K; ++k)
        probs[n * K + k] =
            static_cast<float>(std::exp(static_cast<double>(logits[n * K + k])) / sum);
    }
  };
  softmax();
  // By hand: aux = coef E sum_e f_e P_e, z = coef mean lse^2.
  double want_aux = 0, want_z = 0;
  for (int64_t e = 0; e < E; ++e) {
    double P = 0;
    for (int64_t n = 0; n < N; ++n) P += probs[n * K + e];
    want_aux += static_cast<double>(routed[e]) / N * P / N;
  }
  want_aux *= aux * E;
  for (int64_t n = 0; n < N; ++n) {
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += std::exp(static_cast<double>(logits[n * K + k]));
    want_z += std::log(sum) * std::log(sum);
  }
  want_z *= z / N;
  const RouterLosses got = router_losses(probs.data(), logits.data(), routed.data(), aux, z, N, E);
  EXPECT_NEAR(got.aux, want_aux, 1e-6);
  EXPECT_NEAR(got.z, want_z, 1e-6);
  auto objective = [&] {
    softmax();
    const RouterLosses r = router_losses(probs.data(), logits.data(), routed.data(), aux, z, N, E);
    return scale * (r.aux + r.z);
  };
  std::vector<float> dlogits(N * K, 0.0f);
  router_losses_backward(dlogits.data(), probs.data(), logits.data(), routed.data(), aux, z, scale,
                         N, E);
  expect_fd("dlogits (aux + z)", logits, dlogits, objective, 1e-3f);
}

}  // namespace
}  // namespace anvil::kernels
