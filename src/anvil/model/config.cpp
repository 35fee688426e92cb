#include "anvil/model/config.hpp"

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "anvil/base/error.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/files.hpp"

namespace anvil::model {
namespace {

using json = nlohmann::json;

// 2^42: above the largest published models, far below int64's reach.
constexpr double kMaxParameters = 4398046511104.0;

// One setter per key: the key table is the schema.
using Setter = std::function<void(ModelConfig&, const json&, const std::string& where)>;

// Every size has a ceiling far above any model anvil trains or plans, so that
// the products the families, the planner and the trainer form stay inside
// int64 (and a typo of a few digits is named, not allocated).
int64_t positive(const json& v, const std::string& where, int64_t min = 1,
                 int64_t max = int64_t{1} << 20) {
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > max) {
    throw InputError(where + ": expected an integer from " + std::to_string(min) + " to " +
                     std::to_string(max) + ", got " + v.dump());
  }
  return v.get<int64_t>();
}

// A real number in (0, max], or [min, max] where min > 0 is given.
double positive_real(const json& v, const std::string& where, double max, double min = 0) {
  const bool ok = v.is_number() && (min > 0 ? v.get<double>() >= min : v.get<double>() > 0) &&
                  v.get<double>() <= max;
  if (!ok) {
    const std::string low = min > 0 ? json(min).dump() + " <= x" : "0 < x";
    throw InputError(where + ": expected a number " + low + " <= " + json(max).dump() + ", got " +
                     v.dump());
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
      {"d_model", [](ModelConfig& c, const json& v,
                     const std::string& w) { c.d_model = positive(v, w, 1, 1 << 16); }},
      {"n_layers", [](ModelConfig& c, const json& v,
                      const std::string& w) { c.n_layers = positive(v, w, 1, 1 << 12); }},
      {"n_heads", [](ModelConfig& c, const json& v,
                     const std::string& w) { c.n_heads = positive(v, w, 1, 1 << 12); }},
      {"n_kv_heads", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.n_kv_heads = positive(v, w, 1, 1 << 12); }},
      {"head_dim", [](ModelConfig& c, const json& v,
                      const std::string& w) { c.head_dim = positive(v, w, 1, 1 << 12); }},
      {"vocab_size", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.vocab_size = positive(v, w, 1, 1 << 22); }},
      {"seq_len", [](ModelConfig& c, const json& v,
                     const std::string& w) { c.seq_len = positive(v, w, 1, 1 << 20); }},
      {"ffn_hidden", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.ffn_hidden = positive(v, w, 1, 1 << 20); }},
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
                      const std::string& w) { c.norm_eps = positive_real(v, w, 1.0); }},
      {"rope_theta", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.rope_theta = positive_real(v, w, 1e30, 1.0); }},
      {"rotary_dim", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.rotary_dim = positive(v, w, 0, 1 << 12); }},
      {"n_experts", [](ModelConfig& c, const json& v,
                       const std::string& w) { c.n_experts = positive(v, w, 0, 1 << 12); }},
      {"expert_ffn_hidden",
       [](ModelConfig& c, const json& v, const std::string& w) {
         c.expert_ffn_hidden = positive(v, w, 0, 1 << 18);
       }},
      {"top_k", [](ModelConfig& c, const json& v,
                   const std::string& w) { c.top_k = positive(v, w, 1, 1 << 12); }},
      {"router_dim", [](ModelConfig& c, const json& v,
                        const std::string& w) { c.router_dim = positive(v, w, 0, 1 << 16); }},
      {"router_init_std",
       [](ModelConfig& c, const json& v, const std::string& w) {
         c.router_init_std = positive_real(v, w, 1e3);
       }},
      {"key_temp_init",
       [](ModelConfig& c, const json& v, const std::string& w) {
         if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 1e3)
           throw InputError(w + ": expected a number -1000 <= x <= 1000, got " + v.dump());
         c.key_temp_init = v.get<double>();
       }},
      {"router_lr_scale",
       [](ModelConfig& c, const json& v, const std::string& w) {
         c.router_lr_scale = positive_real(v, w, 1e6);
       }},
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

// What each family's layers need, with the key that breaks it named.
void check_family(const ModelConfig& c, const std::string& origin) {
  const std::string family = std::string(names_of(Family{})[static_cast<size_t>(c.family)]);
  auto need = [&](bool ok, const std::string& key, const std::string& want, const json& got) {
    if (!ok)
      throw InputError(origin + ": " + key + ": the " + family + " family needs " + want +
                       ", got " + got.dump());
  };
  const std::string attention(names_of(Attention{})[static_cast<size_t>(c.attention)]);
  if (c.family == Family::zaya1) {
    need(c.attention == Attention::cca, "attention", "\"cca\"", attention);
    need(c.n_kv_heads == 2, "n_kv_heads", "2 (current- and previous-token values)",
         c.n_kv_heads);
    need(c.n_experts >= 1, "n_experts", ">= 1", c.n_experts);
    need(c.router_dim >= 1, "router_dim", ">= 1", c.router_dim);
    need(c.tied_embeddings, "tied_embeddings", "true", c.tied_embeddings);
  } else {
    need(c.attention != Attention::cca, "attention", "\"mha\" or \"gqa\" (cca is zaya1's)",
         attention);
    need(c.n_experts == 0, "n_experts", "0 (experts are zaya1's)", c.n_experts);
  }
  if (c.n_experts == 0) {  // the experts' keys would be silently unused
    for (const auto& [key, value, unset] :
         {std::tuple{"top_k", c.top_k, int64_t{1}},
          std::tuple{"router_dim", c.router_dim, int64_t{0}},
          std::tuple{"expert_ffn_hidden", c.expert_ffn_hidden, int64_t{0}}}) {
      if (value != unset)
        throw InputError(origin + ": " + key + ": " + std::to_string(value) +
                         " without experts (n_experts 0); expected it left out");
    }
  }
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
  if (c.rotary_dim == 0 && c.head_dim % 2 != 0 &&
      (c.position == Position::rope || c.attention == Attention::cca)) {
    throw InputError(origin + ": rotary_dim 0 rotates all of head_dim (" +
                     std::to_string(c.head_dim) +
                     "), which RoPE needs even; set an even rotary_dim < head_dim");
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
  check_family(c, origin);
  // A bound on the parameters, counted in double: each key's ceiling keeps
  // every single product inside int64, this keeps their sums there too.
  const double d = static_cast<double>(c.d_model), hd = static_cast<double>(c.head_dim);
  const double per_layer =
      2 * d * hd * static_cast<double>(c.n_heads + c.n_kv_heads) +
      3 * d * static_cast<double>(c.ffn_hidden) +
      static_cast<double>(c.n_experts) * 3 * d * static_cast<double>(c.expert_ffn_hidden) +
      static_cast<double>(c.router_dim) * (d + static_cast<double>(c.n_experts) + 1);
  const double params = static_cast<double>(c.n_layers) * per_layer +
                        2 * static_cast<double>(c.vocab_size) * d +
                        static_cast<double>(c.seq_len) * d;
  if (params > kMaxParameters) {
    char text[96];
    std::snprintf(text, sizeof text, ": the model would have ~%.3g parameters (at most %.3g)",
                  params, kMaxParameters);
    throw InputError(origin + text);
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
  std::string where = origin;  // a rule between keys may be broken by an override
  for (size_t i = 0; i < overrides.size(); ++i)
    where += (i == 0 ? " with --set " : ", ") + overrides[i];
  validate(c, where);
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
  if (c.key_temp_init != 1.0) j["key_temp_init"] = c.key_temp_init;
  if (c.skip_output != SkipOutput::input) j["skip_output"] = to_string(c.skip_output);
  if (c.family != default_family(c.attention)) j["family"] = to_string(c.family);
  return j.dump(2);
}

}  // namespace anvil::model
