// Writes a zaya-tiny model (ZAYA1 checkpoint names), a batch, anvil's loss,
// logits, every gradient and each MoE layer's expert choices for
// tests/python/zaya_parity.py. Weights are random around their init so that
// every parameter matters; sign-update balancing of the biases spreads the
// tokens over every expert and the skip class.
// Usage: zaya_parity_dump CONFIG OUT_DIR
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/base/rng.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/zaya_model.hpp"
#include "support/zaya_setup.hpp"

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
  test_support::move_away_from_init(model, 9);
  std::vector<int32_t> tokens(N), targets(N);
  std::vector<float> tok_f(N), tgt_f(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(anvil::random_u64(3, 1, i) % config.vocab_size);
    targets[i] =
        i % 9 == 4 ? -1 : static_cast<int32_t>(anvil::random_u64(3, 2, i) % config.vocab_size);
    tok_f[i] = static_cast<float>(tokens[i]);
    tgt_f[i] = static_cast<float>(targets[i]);
  }
  test_support::spread_choices(model, tokens, targets);
  int64_t scored = 0;
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
