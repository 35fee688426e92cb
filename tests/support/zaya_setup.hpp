// A ZAYA1 model set up so that a comparison exercises everything: weights
// moved away from their init (every parameter matters, routing is not
// uniform) and the balancing biases nudged by sign updates until the tokens
// reach every expert and the skip class; and random batches. Shared by the
// ZAYA1 model tests and the PyTorch parity dump.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "anvil/base/rng.hpp"
#include "anvil/model/zaya_model.hpp"

namespace test_support {

inline void move_away_from_init(anvil::model::ZayaModel& model, uint32_t seed) {
  model.registry().initialize(model.params(), 7);
  std::mt19937 gen(seed);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (const auto& s : model.registry().specs()) {
    // Scales and norms near 1, matrices larger than 0.02 so routing is not uniform.
    const float k = s.init == anvil::model::Init::normal ? 10.0f : 1.0f;
    for (int64_t i = 0; i < s.numel; ++i)
      model.params()[s.offset + i] = model.params()[s.offset + i] * k + noise(gen);
  }
}

// N random tokens and targets over the vocabulary (stream `seed`).
struct Batch {
  std::vector<int32_t> tokens, targets;
};
inline Batch random_batch(int64_t vocab, int64_t N, uint64_t seed) {
  Batch b{std::vector<int32_t>(N), std::vector<int32_t>(N)};
  for (int64_t i = 0; i < N; ++i) {
    b.tokens[i] = static_cast<int32_t>(anvil::random_u64(seed, 1, i) % vocab);
    b.targets[i] = static_cast<int32_t>(anvil::random_u64(seed, 2, i) % vocab);
  }
  return b;
}

// Sign-update balancing of the biases (they steer selection only) over
// `rounds` forward passes of `tokens`.
inline void spread_choices(anvil::model::ZayaModel& model, const std::vector<int32_t>& tokens,
                           const std::vector<int32_t>& targets, int rounds = 200) {
  int64_t scored = 0;
  const double n = static_cast<double>(tokens.size());
  for (int it = 0; it < rounds; ++it) {
    model.forward(tokens.data(), targets.data(), &scored);
    for (size_t m = 0; m < model.balancing_biases().size(); ++m) {
      const auto& load = model.moe_layer(static_cast<int64_t>(m)).stats().tokens_per_class;
      auto& bias = model.balancing_biases()[m];
      const double mean = n / static_cast<double>(bias.size());
      for (size_t e = 0; e < bias.size(); ++e) bias[e] += load[e] < mean ? 0.02f : -0.02f;
    }
  }
}

}  // namespace test_support
