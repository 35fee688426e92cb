#include "anvil/model/config.hpp"

#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/files.hpp"

namespace anvil::model {
namespace {

using json = nlohmann::json;

// One setter per key: the key table is the schema.
using Setter = std::function<void(ModelConfig&, const json&, const std::string& where)>;

int64_t positive(const json& v, const std::string& where, int64_t min = 1) {
  if (!v.is_number_integer() || v.get<int64_t>() < min) {
    throw InputError(where + ": expected an integer >= " + std::to_string(min) + ", got " +
                     v.dump());
  }
  return v.get<int64_t>();
}

double positive_real(const json& v, const std::string& where) {
  if (!v.is_number() || !(v.get<double>() > 0)) {
    throw InputError(where + ": expected a number > 0, got " + v.dump());
  }
  return v.get<double>();
}

// The enum value `v` spells (names_of); InputError listing them otherwise.
template <typename E>
E one_of(const json& v, const std::string& where) {
  constexpr auto names = names_of(E{});
  if (v.is_string()) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (v.get<std::string>() == names[i]) return static_cast<E>(i);
    }
  }
  std::string list;
  for (const auto& a : names) list.append(list.empty() ? "" : " | ").append(a);
  throw InputError(where + ": expected one of " + list + ", got " + v.dump());
}

// The setter of a key whose value is one of E's names.
template <typename E>
Setter enum_key(E ModelConfig::*field) {
  return
      [field](ModelConfig& c, const json& v, const std::string& w) { c.*field = one_of<E>(v, w); };
}

const std::map<std::string, Setter>& schema() {
  static const std::map<std::string, Setter> table = {
      {"name",
       [](ModelConfig& c, const json& v, const std::string& w) {
         if (!v.is_string()) throw InputError(w + ": expected a string, got " + v.dump());
         c.name = v.get<std::string>();
       }},
      {"d_model",
       [](ModelConfig& c, const json& v, const std::string& w) { c.d_model = positive(v, w); }},
      {"n_layers",
       [](ModelConfig& c, const json& v, const std::string& w) { c.n_layers = positive(v, w); }},
      {"n_heads",
       [](ModelConfig& c, const json& v, const std::string& w) { c.n_heads = positive(v, w); }},
      {"n_kv_heads",
       [](ModelConfig& c, const json& v, const std::string& w) { c.n_kv_heads = positive(v, w); }},
      {"head_dim",
       [](ModelConfig& c, const json& v, const std::string& w) { c.head_dim = positive(v, w); }},
      {"vocab_size",
       [](ModelConfig& c, const json& v, const std::string& w) { c.vocab_size = positive(v, w); }},
      {"seq_len",
       [](ModelConfig& c, const json& v, const std::string& w) { c.seq_len = positive(v, w); }},
      {"ffn_hidden",
       [](ModelConfig& c, const json& v, const std::string& w) { c.ffn_hidden = positive(v, w); }},
      {"mlp", enum_key(&ModelConfig::mlp)},
      {"norm", enum_key(&ModelConfig::norm)},
      {"position", enum_key(&ModelConfig::position)},
      {"attention", enum_key(&ModelConfig::attention)},
      {"tied_embeddings",
       [](ModelConfig& c, const json& v, const std::string& w) {
         if (!v.is_boolean()) throw InputError(w + ": expected true or false, got " + v.dump());
         c.tied_embeddings = v.get<bool>();
       }},
      {"bias",
       [](ModelConfig& c, const json& v, const std::string& w) {
         if (!v.is_boolean()) throw InputError(w + ": expected true or false, got " + v.dump());
         c.bias = v.get<bool>();
       }},
      {"norm_eps", [](ModelConfig& c, const json& v,
                      const std::string& w) { c.norm_eps = positive_real(v, w); }},
      {"rope_theta", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.rope_theta = positive_real(v, w); }},
      {"rotary_dim", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.rotary_dim = positive(v, w, 0); }},
      {"n_experts", [](ModelConfig& c, const json& v,
                       const std::string& w) { c.n_experts = positive(v, w, 0); }},
      {"expert_ffn_hidden", [](ModelConfig& c, const json& v,
                               const std::string& w) { c.expert_ffn_hidden = positive(v, w, 0); }},
      {"top_k",
       [](ModelConfig& c, const json& v, const std::string& w) { c.top_k = positive(v, w); }},
      {"router_dim", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.router_dim = positive(v, w, 0); }},
      {"router_init_std", [](ModelConfig& c, const json& v,
                             const std::string& w) { c.router_init_std = positive_real(v, w); }},
      {"router_lr_scale", [](ModelConfig& c, const json& v,
                             const std::string& w) { c.router_lr_scale = positive_real(v, w); }},
      {"skip_output", enum_key(&ModelConfig::skip_output)},
      {"family", enum_key(&ModelConfig::family)},
  };
  return table;
}

void set_key(ModelConfig& c, const std::string& key, const json& value, const std::string& where) {
  const auto it = schema().find(key);
  if (it == schema().end()) {
    std::string keys;
    for (const auto& [k, _] : schema()) keys += (keys.empty() ? "" : ", ") + k;
    throw InputError(where + ": unknown key (expected one of: " + keys + ")");
  }
  it->second(c, value, where);
}

void validate(const ModelConfig& c, const std::string& origin) {
  if (c.n_heads % c.n_kv_heads != 0) {
    throw InputError(origin + ": n_heads (" + std::to_string(c.n_heads) +
                     ") must be a multiple of n_kv_heads (" + std::to_string(c.n_kv_heads) + ")");
  }
  if (c.attention == Attention::mha && c.n_kv_heads != c.n_heads) {
    throw InputError(origin + ": attention \"mha\" needs n_kv_heads == n_heads; use \"gqa\"");
  }
  if (c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0) {
    throw InputError(origin + ": rotary_dim (" + std::to_string(c.rotary_dim) +
                     ") must be even and <= head_dim (" + std::to_string(c.head_dim) + ")");
  }
  if (c.norm == Norm::layernorm && !c.bias) {
    throw InputError(origin + ": norm \"layernorm\" has a bias; use \"rmsnorm\" with bias false");
  }
  if (c.n_experts > 0 && c.expert_ffn_hidden == 0) {
    throw InputError(origin + ": expert_ffn_hidden: expected >= 1 when n_experts > 0");
  }
  if (c.n_experts > 0 && c.top_k > c.n_experts) {
    throw InputError(origin + ": top_k (" + std::to_string(c.top_k) + ") exceeds n_experts (" +
                     std::to_string(c.n_experts) + ")");
  }
}

}  // namespace

Family default_family(Attention attention) {
  return attention == Attention::cca ? Family::zaya1 : Family::dense;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& origin,
                               const std::vector<std::string>& overrides) {
  const json doc = parse_json_unique(json_text, origin);
  if (!doc.is_object()) throw InputError(origin + ": expected a JSON object at the top level");
  ModelConfig c;
  for (const auto& [key, value] : doc.items()) set_key(c, key, value, origin + ": " + key);
  bool family_given = doc.contains("family");
  for (const auto& kv : overrides) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw InputError("--set " + kv + ": expected key=value");
    }
    const std::string key = kv.substr(0, eq);
    const std::string text = kv.substr(eq + 1);
    json value;
    try {
      value = json::parse(text);  // numbers, true/false, quoted strings
    } catch (const json::exception&) {
      value = text;  // a bare word is a string
    }
    set_key(c, key, value, "--set " + key);
    family_given = family_given || key == "family";
  }
  if (!family_given) c.family = default_family(c.attention);
  validate(c, origin);
  return c;
}

ModelConfig load_model_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_model_config(read_file(path), path, overrides);
}

}  // namespace anvil::model

namespace anvil::model {

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"name", c.name},
                      {"d_model", c.d_model},
                      {"n_layers", c.n_layers},
                      {"n_heads", c.n_heads},
                      {"n_kv_heads", c.n_kv_heads},
                      {"head_dim", c.head_dim},
                      {"vocab_size", c.vocab_size},
                      {"seq_len", c.seq_len},
                      {"ffn_hidden", c.ffn_hidden},
                      {"mlp", to_string(c.mlp)},
                      {"norm", to_string(c.norm)},
                      {"position", to_string(c.position)},
                      {"attention", to_string(c.attention)},
                      {"tied_embeddings", c.tied_embeddings},
                      {"bias", c.bias},
                      {"norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"rotary_dim", c.rotary_dim},
                      {"n_experts", c.n_experts},
                      {"expert_ffn_hidden", c.expert_ffn_hidden},
                      {"top_k", c.top_k},
                      {"router_dim", c.router_dim},
                      {"router_init_std", c.router_init_std}};
  // Written only when set, so the configs of earlier checkpoints still match.
  if (c.router_lr_scale != 1.0) j["router_lr_scale"] = c.router_lr_scale;
  if (c.skip_output != SkipOutput::input) j["skip_output"] = to_string(c.skip_output);
  if (c.family != default_family(c.attention)) j["family"] = to_string(c.family);
  return j.dump(2);
}

}  // namespace anvil::model
