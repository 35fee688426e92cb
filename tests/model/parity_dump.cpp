// Writes what the PyTorch parity check (tests/python/decoder_parity.py)
// compares against: a decoder's initial weights, a batch, anvil's logits,
// loss and every gradient for that batch, and the losses of 10 AdamW steps.
// Usage: parity_dump CONFIG OUT_DIR [key=value ...]
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/base/rng.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/muon.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: parity_dump CONFIG OUT_DIR [key=value ...]\n");
    return 2;
  }
  const std::string out = argv[2];
  std::filesystem::create_directories(out);
  const auto config =
      anvil::model::load_model_config(argv[1], std::vector<std::string>(argv + 3, argv + argc));
  const int64_t B = 3, T = config.seq_len;
  anvil::model::Decoder model(config, B, T, true);
  model.registry().initialize(model.params(), 7);
  std::vector<anvil::ckpt::TensorRef> weights;
  for (const auto& s : model.registry().specs()) {
    weights.push_back({s.name, s.shape, model.params() + s.offset});
  }
  anvil::ckpt::write_safetensors(out + "/weights.safetensors", weights);

  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::vector<float> tok_f(B * T), tgt_f(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(anvil::random_u64(3, 1, i) % config.vocab_size);
    // A few rows are not scored (-1), as padding would be.
    targets[i] =
        i % 7 == 3 ? -1 : static_cast<int32_t>(anvil::random_u64(3, 2, i) % config.vocab_size);
    tok_f[i] = static_cast<float>(tokens[i]);
    tgt_f[i] = static_cast<float>(targets[i]);
  }
  int64_t scored = 0;
  model.forward(tokens.data(), targets.data(), B, T, &scored);
  std::vector<float> logits(B * T * config.vocab_size);
  model.logits(logits.data(), B, T);
  model.zero_grads();
  const double loss_sum =
      model.forward_backward(tokens.data(), targets.data(), B, T, 1.0f / scored, &scored);
  const float loss = static_cast<float>(loss_sum / scored);

  std::vector<anvil::ckpt::TensorRef> results = {
      {"tokens", {B, T}, tok_f.data()},
      {"targets", {B, T}, tgt_f.data()},
      {"logits", {B, T, config.vocab_size}, logits.data()},
      {"loss", {1}, &loss},
  };
  // A copy: the optimizer steps below reuse the gradient arena.
  const std::vector<float> grads(model.grads(), model.grads() + model.registry().total());
  for (const auto& s : model.registry().specs()) {
    results.push_back({"grad." + s.name, s.shape, grads.data() + s.offset});
  }

  // Ten AdamW steps on the same batch with clipping.
  anvil::optim::AdamWConfig ac;
  ac.weight_decay = 0.1f;
  anvil::optim::AdamW adamw(model.registry(), ac);
  std::vector<float> losses;
  for (int step = 0; step < 10; ++step) {
    model.zero_grads();
    const double l =
        model.forward_backward(tokens.data(), targets.data(), B, T, 1.0f / scored, &scored);
    losses.push_back(static_cast<float>(l / scored));
    const double norm = anvil::optim::global_norm(model.grads(), model.registry().total());
    adamw.update(model.params(), model.grads(), 1e-3f, step + 1,
                 anvil::optim::clip_coefficient(norm, 1.0));
  }
  results.push_back({"adamw_losses", {10}, losses.data()});

  // Ten Muon steps (block matrices) + AdamW (the rest) from the same init.
  model.registry().initialize(model.params(), 7);
  anvil::optim::AdamW rest(model.registry(), ac, /*skip_muon_group=*/true);
  anvil::optim::Muon muon(model.registry(), {});
  std::vector<float> muon_losses;
  for (int step = 0; step < 10; ++step) {
    model.zero_grads();
    const double l =
        model.forward_backward(tokens.data(), targets.data(), B, T, 1.0f / scored, &scored);
    muon_losses.push_back(static_cast<float>(l / scored));
    const double norm = anvil::optim::global_norm(model.grads(), model.registry().total());
    const float coef = anvil::optim::clip_coefficient(norm, 1.0);
    rest.update(model.params(), model.grads(), 1e-3f, step + 1, coef);
    muon.update(model.params(), model.grads(), 1e-3f, coef);
  }
  results.push_back({"muon_losses", {10}, muon_losses.data()});

  // Decode with the KV cache must give the full forward's logits, row by row.
  anvil::model::Decoder infer(config, 1, 1, false);
  std::copy(model.params(), model.params() + model.registry().total(), infer.params());
  model.forward(tokens.data(), targets.data(), 1, T, &scored);
  std::vector<float> full(T * config.vocab_size), step_logits(T * config.vocab_size);
  model.logits(full.data(), 1, T);
  infer.start_decode(T);
  for (int64_t t = 0; t < T; ++t)
    infer.decode_step(tokens[t], t, step_logits.data() + t * config.vocab_size);
  results.push_back({"prefill_logits", {T, config.vocab_size}, full.data()});
  results.push_back({"decode_logits", {T, config.vocab_size}, step_logits.data()});
  anvil::ckpt::write_safetensors(out + "/anvil.safetensors", results,
                                 {{"config", anvil::model::model_config_to_json(config)}});
  return 0;
}
