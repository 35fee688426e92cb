#include "anvil/model/param_count.hpp"

#include <map>
#include <nlohmann/json.hpp>

#include "anvil/base/table.hpp"
#include "anvil/model/family.hpp"

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

}  // namespace

ParamCount count_registry(const std::string& model, const ParamRegistry& registry) {
  ParamCount out;
  out.model = model;
  out.method = "registry";
  std::map<std::string, int64_t> by;
  std::vector<std::string> order;
  for (const auto& s : registry.specs()) {
    const std::string comp = component_of(s.name);
    if (by.find(comp) == by.end()) order.push_back(comp);
    by[comp] += s.numel;
  }
  for (const auto& comp : order) {
    const bool emb = comp == "token embedding" || comp == "position embedding" || comp == "lm head";
    out.components.push_back({comp, by[comp], by[comp], emb});
  }
  out.sum_components();
  return out;
}

void ParamCount::sum_components() {
  embedding = non_embedding_total = non_embedding_active = 0;
  for (const auto& comp : components) {
    if (comp.embedding) {
      embedding += comp.total;
    } else {
      non_embedding_total += comp.total;
      non_embedding_active += comp.active;
    }
  }
}

ParamCount count_parameters(const ModelConfig& c) {
  return model_family(c).count_parameters(c);
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
