#include "anvil/model/param_count.hpp"

#include <map>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/table.hpp"
#include "anvil/model/decoder.hpp"

namespace anvil::model {
namespace {

// The component a registry name belongs to.
std::string component_of(const std::string& name) {
  if (name.find("embed_tokens") != std::string::npos) return "token embedding";
  if (name.find("embed_positions") != std::string::npos) return "position embedding";
  if (name.rfind("lm_head", 0) == 0) return "lm head";
  if (name.find("layernorm") != std::string::npos || name.rfind("model.norm", 0) == 0)
    return "norms";
  if (name.find("self_attn") != std::string::npos) return "attention";
  if (name.find("mlp") != std::string::npos) return "mlp";
  return "other";
}

ParamCount count_from_registry(const ModelConfig& c) {
  ParamCount out;
  out.model = c.name;
  out.method = "registry";
  std::map<std::string, int64_t> by;
  std::vector<std::string> order;
  const ParamRegistry registry = decoder_registry(c);
  for (const auto& s : registry.specs()) {
    const std::string comp = component_of(s.name);
    if (by.find(comp) == by.end()) order.push_back(comp);
    by[comp] += s.numel;
  }
  for (const auto& comp : order) {
    const bool emb = comp == "token embedding" || comp == "position embedding" || comp == "lm head";
    out.components.push_back({comp, by[comp], by[comp], emb});
  }
  return out;
}

// ZAYA1.md sections 1, 3, 4, 5, 7: per block one CCA layer and one MoE layer.
ParamCount count_zaya1(const ModelConfig& c) {
  if (c.n_experts < 1 || c.router_dim < 1) {
    throw InputError("config " + c.name +
                     ": CCA attention is counted as ZAYA1, which needs n_experts >= 1 and "
                     "router_dim >= 1");
  }
  const int64_t H = c.d_model, L = c.n_layers, d = c.head_dim;
  const int64_t Cq = c.n_heads * d, Ck = c.n_kv_heads * d, conv_ch = Cq + Ck;
  const int64_t R = c.router_dim, E = c.n_experts, F = c.expert_ffn_hidden;
  const int64_t kernel = 2;                               // both causal convolutions
  const int64_t attention = Cq * H + Ck * H + 2 * d * H   // q, k, val_proj1/2
                            + conv_ch * kernel + conv_ch  // depthwise conv + bias
                            + conv_ch * d * kernel +
                            conv_ch          // grouped conv (one group per head) + bias
                            + c.n_kv_heads   // key temperatures
                            + H * Cq;        // o_proj
  const int64_t router = R * H + R           // down projection + bias
                         + R                 // RMSNorm on the router state
                         + 2 * (R * R + R)   // MLP layers 0 and 2 (biases)
                         + (E + 1) * R;      // to E experts + the skip class (no bias)
  const int64_t eda = R * (L - 1);           // router_states_scale, not in the first MoE layer
  const int64_t expert = 2 * F * H + H * F;  // SwiGLU fc1 (gate|up) + fc2
  const int64_t norms = 2 * L * H + H;       // one per layer + final
  // Residual scaling: 4 vectors per merge, 2 on the first; merges = 2L layers + final.
  const int64_t res_scale = (2 * L + 1) * 4 * H - 2 * H;
  ParamCount out;
  out.model = c.name;
  out.method = "zaya1 spec";
  const int64_t emb = c.vocab_size * H;
  out.components = {
      {"token embedding", emb, emb, true},
      {"attention (CCA)", L * attention, L * attention, false},
      {"router", L * router + eda, L * router + eda, false},
      {"experts", L * E * expert, L * c.top_k * expert, false},
      {"norms", norms, norms, false},
      {"residual scaling", res_scale, res_scale, false},
  };
  if (!c.tied_embeddings) out.components.push_back({"lm head", emb, emb, true});
  return out;
}

}  // namespace

ParamCount count_parameters(const ModelConfig& c) {
  ParamCount out = c.attention == "cca" ? count_zaya1(c) : count_from_registry(c);
  for (const auto& comp : out.components) {
    if (comp.embedding) {
      out.embedding += comp.total;
    } else {
      out.non_embedding_total += comp.total;
      out.non_embedding_active += comp.active;
    }
  }
  return out;
}

std::string ParamCount::to_json() const {
  nlohmann::json comps = nlohmann::json::array();
  for (const auto& c : components) {
    comps.push_back({{"component", c.component},
                     {"total", c.total},
                     {"active", c.active},
                     {"embedding", c.embedding}});
  }
  nlohmann::json j = {{"model", model},
                      {"method", method},
                      {"components", comps},
                      {"embedding", embedding},
                      {"non_embedding_total", non_embedding_total},
                      {"non_embedding_active", non_embedding_active},
                      {"total", total()},
                      {"active", active()}};
  return j.dump(2) + "\n";
}

std::string ParamCount::text() const {
  Table t({"component", "total", "active", "total (B)", "active (B)"});
  auto row = [&](const std::string& name, int64_t total, int64_t active) {
    t.add_row({name, std::to_string(total), std::to_string(active), fmt(total / 1e9, 4),
               fmt(active / 1e9, 4)});
  };
  for (const auto& c : components) row(c.component, c.total, c.active);
  row("= non-embedding", non_embedding_total, non_embedding_active);
  row("= embedding", embedding, embedding);
  row("= all", total(), active());
  return "# " + model + ": parameters (counted from the " + method + ")\n" + t.to_text();
}

}  // namespace anvil::model
