// Writes a zaya-tiny model (ZAYA1 checkpoint names), a batch, anvil's loss,
// logits, every gradient and each MoE layer's expert choices for
// tests/python/zaya_parity.py. Weights are random around their init so that
// every parameter matters; sign-update balancing of the biases spreads the
// tokens over every expert and the skip class.
// Usage: zaya_parity_dump CONFIG OUT_DIR
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "anvil/base/rng.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/zaya_model.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: zaya_parity_dump CONFIG OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[2];
  std::filesystem::create_directories(out);
  const auto config = anvil::model::load_model_config(argv[1]);
  const int64_t B = 2, T = config.seq_len, N = B * T;
  anvil::model::ZayaModel model(config, B, T);
  model.registry().initialize(model.params(), 7);
  std::mt19937 gen(9);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (const auto& s : model.registry().specs()) {
    // Scales and norms near 1, matrices larger than 0.02 so routing is not uniform.
    const float k = s.init == anvil::model::Init::normal ? 10.0f : 1.0f;
    for (int64_t i = 0; i < s.numel; ++i)
      model.params()[s.offset + i] = model.params()[s.offset + i] * k + noise(gen);
  }
  std::vector<int32_t> tokens(N), targets(N);
  std::vector<float> tok_f(N), tgt_f(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(anvil::random_u64(3, 1, i) % config.vocab_size);
    targets[i] =
        i % 9 == 4 ? -1 : static_cast<int32_t>(anvil::random_u64(3, 2, i) % config.vocab_size);
    tok_f[i] = static_cast<float>(tokens[i]);
    tgt_f[i] = static_cast<float>(targets[i]);
  }
  int64_t scored = 0;
  // Spread the tokens over every expert and the skip class with sign-update
  // balancing of the biases (they steer selection only).
  for (int it = 0; it < 200; ++it) {
    model.forward(tokens.data(), targets.data(), &scored);
    for (size_t m = 0; m < model.balancing_biases().size(); ++m) {
      const auto& load = model.moe_layer(static_cast<int64_t>(m)).stats().tokens_per_class;
      auto& bias = model.balancing_biases()[m];
      const double mean = static_cast<double>(N) / static_cast<double>(bias.size());
      for (size_t e = 0; e < bias.size(); ++e) bias[e] += load[e] < mean ? 0.02f : -0.02f;
    }
  }
  model.forward(tokens.data(), targets.data(), &scored);
  std::vector<float> logits(N * config.vocab_size);
  model.logits(logits.data());
  model.zero_grads();
  const float loss = static_cast<float>(
      model.forward_backward(tokens.data(), targets.data(), 1.0f / scored, &scored) / scored);
  std::vector<anvil::ckpt::TensorRef> t;
  for (const auto& s : model.registry().specs()) {
    t.push_back({s.name, s.shape, model.params() + s.offset});
    t.push_back({"grad." + s.name, s.shape, model.grads() + s.offset});
  }
  std::vector<std::vector<float>> choices;
  for (size_t m = 0; m < model.balancing_biases().size(); ++m) {
    const int64_t n = 2 * static_cast<int64_t>(m) + 1;
    t.push_back({"model.layers." + std::to_string(n) + ".zaya_block.router.balancing_biases",
                 {config.n_experts + 1},
                 model.balancing_biases()[m].data()});
    const auto& c = model.moe_layer(static_cast<int64_t>(m)).choices();
    choices.emplace_back(c.begin(), c.end());
  }
  for (size_t m = 0; m < choices.size(); ++m) {
    t.push_back({"choices." + std::to_string(2 * m + 1), {N}, choices[m].data()});
  }
  t.push_back({"tokens", {B, T}, tok_f.data()});
  t.push_back({"targets", {B, T}, tgt_f.data()});
  t.push_back({"logits", {B, T, config.vocab_size}, logits.data()});
  t.push_back({"loss", {1}, &loss});
  anvil::ckpt::write_safetensors(out + "/zaya.safetensors", t,
                                 {{"config", anvil::model::model_config_to_json(config)}});
  return 0;
}
