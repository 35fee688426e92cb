// The adapter registry, the generic reading and writing of config.json
// through an architecture's key table, and the key builders the tables
// share.
#include "anvil/ckpt/hf_adapter.hpp"

#include <cmath>
#include <cstdint>

#include "anvil/base/error.hpp"

namespace anvil::ckpt {
using json = nlohmann::json;

std::span<const HfAdapter* const> hf_adapters() {
  static const HfAdapter* const adapters[] = {&zaya1_hf_adapter(), &dense_hf_adapter()};
  return adapters;
}

const HfAdapter& hf_adapter(model::Family family) {
  for (const HfAdapter* a : hf_adapters()) {
    if (a->family == family) return *a;
  }
  throw InputError("family " + model::to_string(family) + ": no Hugging Face adapter (expected " +
                   "one in ckpt/hf_adapter.cpp's list)");
}

json hf_config_keys(const HfArchitecture& arch, const model::ModelConfig& config) {
  json j = json::object();
  for (const HfKey& k : arch.keys) {
    if (k.write) j[k.key] = k.write(config);
  }
  return j;
}

model::ModelConfig config_from_hf_keys(const HfArchitecture& arch, const HfSource& source,
                                       const std::string& path) {
  model::ModelConfig c;
  c.name = source.doc.value("_name_or_path", "imported-" + arch.name);
  if (c.name.empty()) c.name = "imported";
  static const json absent = nullptr;
  try {
    if (arch.fixed) arch.fixed(c);
    for (const HfKey& k : arch.keys) {
      if (!k.read) continue;
      const auto it = source.doc.find(k.key);
      k.read(c, it == source.doc.end() ? absent : *it, source);
    }
    if (arch.derived) arch.derived(c);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  return c;
}

std::function<void(model::ModelConfig&)> hf_fixed(model::Family family, model::Mlp mlp,
                                                  model::Norm norm, model::Position position,
                                                  std::function<void(model::ModelConfig&)> more) {
  return [=](model::ModelConfig& c) {
    c.family = family;
    c.mlp = mlp;
    c.norm = norm;
    c.position = position;
    if (more) more(c);
  };
}

int64_t hf_integer(const json& v, const std::string& key) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw InputError(key + ": expected an integer, got " + v.dump());
  if (v.is_number_integer()) return v.get<int64_t>();
  // 2^63 is exactly representable: the range check is exact.
  if (v.is_number_float() && std::isfinite(v.get<double>()) &&
      v.get<double>() == std::trunc(v.get<double>()) && v.get<double>() >= -0x1p63 &&
      v.get<double>() < 0x1p63)
    return static_cast<int64_t>(v.get<double>());
  throw InputError(key + ": expected an integer, got " + v.dump());
}

HfKey hf_required(const std::string& key, int64_t model::ModelConfig::*field) {
  return {key, [field](const model::ModelConfig& c) { return json(c.*field); },
          [key, field](model::ModelConfig& c, const json& v, const HfSource&) {
            if (!v.is_number()) throw InputError("no number " + key);
            c.*field = hf_integer(v, key);
          }};
}

HfKey hf_optional(const std::string& key, int64_t model::ModelConfig::*field,
                  std::function<int64_t(const model::ModelConfig&)> fallback) {
  return {key, [field](const model::ModelConfig& c) { return json(c.*field); },
          [key, field, fallback](model::ModelConfig& c, const json& v, const HfSource&) {
            c.*field = v.is_number() ? hf_integer(v, key) : fallback(c);
          }};
}

HfKey hf_optional(const std::string& key, double model::ModelConfig::*field, double fallback) {
  return {key, [field](const model::ModelConfig& c) { return json(c.*field); },
          [field, fallback](model::ModelConfig& c, const json& v, const HfSource&) {
            c.*field = v.is_number() ? v.get<double>() : fallback;
          }};
}

HfKey hf_optional(const std::string& key, bool model::ModelConfig::*field, bool fallback) {
  return {key, [field](const model::ModelConfig& c) { return json(c.*field); },
          [field, fallback](model::ModelConfig& c, const json& v, const HfSource&) {
            c.*field = v.is_boolean() ? v.get<bool>() : fallback;
          }};
}

HfKey hf_constant(const std::string& key, json value) {
  return {key, [value](const model::ModelConfig&) { return value; }, {}};
}

HfKey hf_checked(const std::string& key, json value, std::function<bool(const json&)> accepts,
                 std::function<std::string(const json&)> why) {
  return {key, [value](const model::ModelConfig&) { return value; },
          [accepts, why](model::ModelConfig&, const json& v, const HfSource&) {
            if (!v.is_null() && !accepts(v)) throw InputError(why(v));
          }};
}

std::vector<HfKey> transformers_decoder_keys() {
  using C = model::ModelConfig;
  return {
      hf_required("vocab_size", &C::vocab_size),
      hf_required("hidden_size", &C::d_model),
      hf_required("num_attention_heads", &C::n_heads),
      hf_optional("num_key_value_heads", &C::n_kv_heads, [](const C& c) { return c.n_heads; }),
      hf_optional("head_dim", &C::head_dim, [](const C& c) { return c.d_model / c.n_heads; }),
      hf_required("max_position_embeddings", &C::seq_len),
      hf_optional("rms_norm_eps", &C::norm_eps, 1e-6),
      hf_checked(
          "hidden_act", "silu", [](const json& v) { return v == "silu"; },
          [](const json& v) { return "hidden_act " + v.dump() + " (expected silu)"; }),
  };
}

json rope_parameters(const json& doc, const char* layer_type) {
  json p = doc.value("rope_parameters", json::object());
  if (layer_type && p.contains(layer_type)) p = p[layer_type];
  if (!p.is_object()) p = json::object();
  if (!p.contains("rope_theta") && doc.contains("rope_theta")) p["rope_theta"] = doc["rope_theta"];
  if (p.value("rope_type", std::string("default")) != "default")
    throw InputError("rope_type " + p["rope_type"].dump() + " (anvil has the default RoPE only)");
  if (doc.contains("rope_scaling") && !doc["rope_scaling"].is_null())
    throw InputError("rope_scaling is set (anvil has the default RoPE only)");
  return p;
}

}  // namespace anvil::ckpt
