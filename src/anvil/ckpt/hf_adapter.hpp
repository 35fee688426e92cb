// A model family's Hugging Face adapter, after torchtitan's
// state_dict_adapter: for each transformers architecture that computes
// what the family computes, one table of config.json keys read both ways
// (export writes each key from the config, import sets the config from
// it) and the map from transformers' tensor names to anvil's. The generic
// export and import (hf.hpp) read nothing else, so the two directions
// cannot drift apart. hf_dense.cpp (GPT-2, Llama) and hf_zaya1.cpp (ZAYA1
// and its original layout) hold the adapters.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"

namespace anvil::ckpt {

// One tensor of transformers' layout: anvil tensors `parts` concatenated
// along their first dimension (stacked under a new first dimension when
// `stack`), stored transposed as a 2-D matrix when `transpose` (GPT-2's
// Conv1D keeps [in, out]).
struct HfTensor {
  std::string name;
  std::vector<std::string> parts;
  bool stack = false;
  bool transpose = false;
};

// What import reads a key from: the whole config.json, and whether the
// weights are in the family's original layout rather than transformers'.
struct HfSource {
  const nlohmann::json& doc;
  bool original = false;
};

// One key of config.json. `write` gives its value for a config (export;
// empty: not written); `read` sets the config from `value` (import; a null
// `value` when the key is absent; empty: the key is not read). A read
// throws InputError with the reason only; the caller names the file.
struct HfKey {
  std::string key;
  std::function<nlohmann::json(const model::ModelConfig&)> write;
  std::function<void(model::ModelConfig&, const nlohmann::json& value, const HfSource&)> read;
};

struct HfArchitecture {
  std::string name;  // config.json's architectures[0], e.g. "LlamaForCausalLM"
  // Import: sets what the architecture fixes (family, norm, MLP, ...)
  // before the keys are read, and what follows from them after.
  std::function<void(model::ModelConfig&)> fixed;
  std::vector<HfKey> keys;  // in import order
  std::function<void(model::ModelConfig&)> derived;
  // transformers' tensors in file order, each from anvil's.
  std::function<std::vector<HfTensor>(const model::ModelConfig&)> tensors;
};

// A family's own layout besides transformers' (ZAYA1's alternating layers,
// which Zyphra's converter reads): anvil's tensor names as they are, and a
// config.json derived from the architecture's.
struct HfOriginalLayout {
  std::string owner;  // whose layout it is, in messages ("ZAYA1")
  const HfArchitecture* architecture = nullptr;
  // Whether a checkpoint tensor's name shows this layout.
  std::function<bool(const std::string& tensor)> shows;
  std::function<nlohmann::json(const model::ModelConfig&, nlohmann::json hf_config)> config;
};

struct HfAdapter {
  model::Family family;
  std::vector<const HfArchitecture*> architectures;
  // The architecture that computes exactly what `config` computes;
  // InputError naming `what` when none does.
  std::function<const HfArchitecture&(const model::ModelConfig& config, const std::string& what)>
      choose;
  const HfOriginalLayout* original = nullptr;  // none
};

// Every family's adapter, and the one of a family (InputError when it has none).
std::span<const HfAdapter* const> hf_adapters();
const HfAdapter& hf_adapter(model::Family family);

// config.json from the architecture's key table (without the keys every
// export shares: architectures, dtype, token ids, anvil's own).
nlohmann::json hf_config_keys(const HfArchitecture& architecture, const model::ModelConfig& config);
// A config from config.json through the architecture's key table;
// InputError naming `path` on a missing or unsupported value.
model::ModelConfig config_from_hf_keys(const HfArchitecture& architecture, const HfSource& source,
                                       const std::string& path);

// An architecture's `fixed`: the family and layer kinds it computes, then
// `more` (may be empty) for the rest it fixes.
std::function<void(model::ModelConfig&)> hf_fixed(model::Family family, model::Mlp mlp,
                                                  model::Norm norm, model::Position position,
                                                  std::function<void(model::ModelConfig&)> more);

// Key builders for the tables. A required number: "no number KEY" when absent.
// An integer key's value: an integer, or a float with an integral value in
// int64's range (some exporters write 12.0); anything else is an InputError
// naming `key`.
int64_t hf_integer(const nlohmann::json& v, const std::string& key);
HfKey hf_required(const std::string& key, int64_t model::ModelConfig::*field);
// An optional integer, real or bool: `fallback` of the config read so far when absent.
HfKey hf_optional(const std::string& key, int64_t model::ModelConfig::*field,
                  std::function<int64_t(const model::ModelConfig&)> fallback);
HfKey hf_optional(const std::string& key, double model::ModelConfig::*field, double fallback);
HfKey hf_optional(const std::string& key, bool model::ModelConfig::*field, bool fallback);
// A value export writes that import does not read (transformers' settings
// anvil has no choice of).
HfKey hf_constant(const std::string& key, nlohmann::json value);
// A value export writes that import requires when present: InputError
// `why(value)` unless `accepts(value)`.
HfKey hf_checked(const std::string& key, nlohmann::json value,
                 std::function<bool(const nlohmann::json&)> accepts,
                 std::function<std::string(const nlohmann::json&)> why);

// The keys transformers' decoders (Llama, ZAYA1) share: vocabulary,
// widths, heads, head_dim, max_position_embeddings, rms_norm_eps, silu;
// num_hidden_layers is each architecture's own.
std::vector<HfKey> transformers_decoder_keys();
// transformers' RoPE settings under rope_parameters (per layer type when
// `layer_type`), or a top-level rope_theta; InputError for RoPE other than
// the default.
nlohmann::json rope_parameters(const nlohmann::json& doc, const char* layer_type);

// The registered adapters (hf_dense.cpp, hf_zaya1.cpp).
const HfAdapter& dense_hf_adapter();
const HfAdapter& zaya1_hf_adapter();

}  // namespace anvil::ckpt
