// The interop test's view of anvil: the full forward's logits of one
// checkpoint (dense or ZAYA1) for one row of tokens, written as
// OUT.safetensors {"logits": [T, V]}, for tests/python/hf_interop.py to
// compare with transformers.
//   logits_dump CHECKPOINT TOKENS(comma-separated) OUT.safetensors
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/zaya_model.hpp"

int main(int argc, char** argv) {
  using namespace anvil;
  if (argc != 4) {
    std::fprintf(stderr, "usage: logits_dump CHECKPOINT TOKENS OUT.safetensors\n");
    return 2;
  }
  try {
    const std::string dir = ckpt::resolve_checkpoint(argv[1]);
    const auto state = ckpt::read_state(dir);
    const auto config = model::parse_model_config(state.at("config").dump(), dir);
    std::vector<int32_t> tokens;
    std::stringstream in(argv[2]);
    for (std::string t; std::getline(in, t, ',');) tokens.push_back(std::stoi(t));
    const auto T = static_cast<int64_t>(tokens.size());
    std::vector<int32_t> targets(tokens.size(), -1);
    std::vector<float> logits(static_cast<size_t>(T * config.vocab_size));
    int64_t scored = 0;
    if (config.family == model::Family::zaya1) {
      model::ZayaModel m(config, 1, T);
      ckpt::load_weights(dir, m.registry(), m.params(), m.extra_state());
      m.forward(tokens.data(), targets.data(), &scored);
      m.logits(logits.data());
    } else {
      model::Decoder m(config, 1, T, /*training=*/false);
      ckpt::load_weights(dir, m.registry(), m.params());
      m.forward(tokens.data(), targets.data(), 1, T, &scored);
      m.logits(logits.data(), 1, T);
    }
    ckpt::write_safetensors(argv[3], {{"logits", {T, config.vocab_size}, logits.data()}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "logits_dump: %s\n", e.what());
    return 2;
  }
  return 0;
}
