// ZAYA1 expert-bias balancing (docs/zaya1-spec.md section 4): the controller moves the
// biases against the load error; the skip class's bias follows a target skip
// rate when one is set and stays at its init otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "anvil/base/rng.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/zaya_balancing.hpp"
#include "anvil/model/zaya_model.hpp"

namespace anvil::model {
namespace {

// Runs `steps` forward/backward passes on fixed random tokens (the weights
// do not change: only the balancing biases do) and returns the skip rate of
// each step averaged over the MoE layers.
std::vector<double> skip_rates(ZayaModel& model, const ModelConfig& c, int64_t B, int steps) {
  const int64_t T = c.seq_len;
  model.registry().initialize(model.params(), 11);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(random_u64(5, 2, i) % c.vocab_size);
    targets[i] = static_cast<int32_t>(random_u64(5, 3, i) % c.vocab_size);
  }
  std::vector<double> rates;
  for (int s = 1; s <= steps; ++s) {
    int64_t scored = 0;
    model.forward_backward(tokens.data(), targets.data(), B, T, 1.0f, &scored);
    model.after_step(s);
    double rate = 0;
    const auto layers = model.step_metrics()["router"];
    for (const auto& l : layers) rate += l["skip_rate"].get<double>();
    rates.push_back(rate / static_cast<double>(layers.size()));
  }
  return rates;
}

TEST(ZayaBalancing, SkipBiasFollowsATargetRateAndStaysFixedWithout) {
  const auto c = load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
  const int64_t B = 2;
  Balancing fixed{"sign", 0.05f};
  ZayaModel plain(c, B, c.seq_len, fixed);
  const auto none = skip_rates(plain, c, B, 40);
  EXPECT_EQ(none.back(), 0.0);  // -1 on a probability: skip never wins
  for (const auto& b : plain.balancing_biases()) EXPECT_EQ(b.back(), -1.0f);

  Balancing target = fixed;
  target.skip_target = 0.25f;
  ZayaModel steered(c, B, c.seq_len, target);
  const auto rates = skip_rates(steered, c, B, 60);
  double late = 0;
  for (size_t i = rates.size() - 10; i < rates.size(); ++i) late += rates[i] / 10.0;
  EXPECT_GT(late, 0.1) << "the skip bias did not rise towards the target";
  EXPECT_LT(late, 0.45) << "the skip bias overshot the target";
  for (const auto& b : steered.balancing_biases()) EXPECT_GT(b.back(), -1.0f);
}

TEST(ZayaBalancing, PidEvensOutTheExpertLoads) {
  const auto c = load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json",
                                   {"router_init_std=0.5"});  // a router with clear preferences
  const int64_t B = 2;
  auto worst_ratio = [&](ZayaModel& m) {
    double worst = 0;
    const auto metrics = m.step_metrics();
    for (const auto& l : metrics["router"]) {
      // null: an expert got no token.
      worst = std::max(worst, l["max_over_min"].is_null() ? 1e9 : l["max_over_min"].get<double>());
    }
    return worst;
  };
  ZayaModel unbalanced(c, B, c.seq_len, Balancing{"none"});
  skip_rates(unbalanced, c, B, 80);
  Balancing pid{"pid", 0.02f};
  pid.beta2 = 0.9f;
  ZayaModel balanced(c, B, c.seq_len, pid);
  skip_rates(balanced, c, B, 80);
  EXPECT_LT(worst_ratio(balanced), worst_ratio(unbalanced));
  EXPECT_LT(worst_ratio(balanced), 3.0) << balanced.step_metrics().dump();
  EXPECT_GT(worst_ratio(unbalanced), 3.0) << unbalanced.step_metrics().dump();
}

// A router in miniature: each step draws fresh tokens whose scores are
// uniform in [0, 0.2] per expert, except a cluster (a quarter of them) that
// experts 0 and 1 both want, at 0.5 give or take 0.01 — two experts sharing a
// kind of token, as trained routers do (docs/zaya1.md, "Balancing"). Routes
// each token to the best biased score, feeds the loads to the balancer and
// returns each step's max/min load.
std::vector<double> simulate_twins(const Balancing& settings, int steps) {
  const int64_t E = 8, N = 8192;
  BiasBalancer balancer(settings, 1, E);
  std::vector<double> ratios;
  std::vector<float> score(static_cast<size_t>(E + 1));
  for (int s = 1; s <= steps; ++s) {
    std::vector<int64_t> load(static_cast<size_t>(E + 1), 0);
    const float* bias = balancer.biases(0);
    for (int64_t t = 0; t < N; ++t) {
      const uint64_t key = static_cast<uint64_t>(s) * N + static_cast<uint64_t>(t);
      for (int64_t e = 0; e < E; ++e) score[e] = 0.2f * static_cast<float>(random_unit(7, key, e));
      score[E] = 0.0f;  // skip: with its -1 bias it never wins
      if (t % 4 == 0) {
        score[0] = 0.5f + 1e-2f * static_cast<float>(random_unit(7, key, 100));
        score[1] = 0.5f + 1e-2f * static_cast<float>(random_unit(7, key, 101));
      }
      int64_t best = 0;
      for (int64_t e = 1; e <= E; ++e) {
        if (score[e] + bias[e] > score[best] + bias[best]) best = e;
      }
      ++load[static_cast<size_t>(best)];
    }
    int64_t lo = N, hi = 0;
    for (int64_t e = 0; e < E; ++e) {
      lo = std::min(lo, load[static_cast<size_t>(e)]);
      hi = std::max(hi, load[static_cast<size_t>(e)]);
    }
    ratios.push_back(lo == 0 ? 1e9 : static_cast<double>(hi) / static_cast<double>(lo));
    balancer.update(0, load, s);
  }
  return ratios;
}

// Median and worst of the last n entries.
std::pair<double, double> median_worst(const std::vector<double>& r, size_t n) {
  std::vector<double> last(r.end() - static_cast<std::ptrdiff_t>(n), r.end());
  std::sort(last.begin(), last.end());
  return {last[n / 2], last.back()};
}

TEST(ZayaBalancing, PidSplitsAClusterTwoExpertsShare) {
  // The defaults settle near the sampling noise (1024 tokens per expert
  // alone give ~1.15): the last 50 steps' median within 1.5, none above 2.5.
  const auto [median, worst] = median_worst(simulate_twins(Balancing{}, 300), 50);
  EXPECT_LT(median, 1.5);
  EXPECT_LT(worst, 2.5);
  // Without momentum on the error, each step's correction (~lr) is larger
  // than the spread of the cluster's scores: the cluster flips between the
  // two experts and one of them is nearly idle every step.
  Balancing no_momentum;
  no_momentum.beta1 = 0.0f;
  no_momentum.beta2 = 0.9f;
  no_momentum.eps = 1e-2f;
  EXPECT_GT(median_worst(simulate_twins(no_momentum, 300), 50).first, 3.0);
}

}  // namespace
}  // namespace anvil::model
