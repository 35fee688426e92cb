// A checkpoint's tensors against the model its state.json's config builds
// (ckpt/model_tensors.hpp).
#include "anvil/ckpt/model_tensors.hpp"

#include <map>
#include <utility>

#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"

namespace anvil::ckpt {

using json = nlohmann::json;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

std::vector<std::string> model_tensor_problems(const std::string& dir, const json& state,
                                               const json& index) {
  // Train states without a model (tools' fixtures) have nothing to check.
  if (!state.contains("config") || !state["config"].is_object() || state["config"].empty())
    return {};
  // In registry order, so the first problem named is the first tensor's.
  std::vector<std::pair<std::string, std::vector<int64_t>>> order;
  std::map<std::string, std::vector<int64_t>> want;
  try {
    const model::ModelConfig c =
        model::parse_model_config(state.at("config").dump(), dir + "/state.json: config");
    // A config from elsewhere may imply millions of tensors (thousands of
    // layers of thousands of experts): named, not built, when it implies
    // far more than the index holds (a model has under ~2 n_experts + 40
    // tensors a layer).
    const double implied =
        static_cast<double>(c.n_layers) * (2.0 * static_cast<double>(c.n_experts) + 40.0) + 16.0;
    const double held = static_cast<double>(index["tensors"].size());
    if (implied > 64.0 * (held + 64.0))
      return {dir + "/state.json: its config implies up to " +
              std::to_string(static_cast<int64_t>(implied)) + " tensors, the index holds " +
              std::to_string(static_cast<int64_t>(held))};
    const model::ModelFamily& family = model::model_family(c);
    const model::ParamRegistry registry = family.registry(c);
    for (const auto& spec : registry.specs()) order.emplace_back(spec.name, spec.shape);
    for (const auto& extra : family.extra_state_shapes(c)) order.push_back(extra);
    for (const auto& [name, shape] : order) want[name] = shape;
  } catch (const std::exception& e) {
    return {e.what()};
  }
  std::vector<std::string> problems;
  int64_t more = 0;
  const auto add = [&](std::string why) {
    if (problems.size() < 8)
      problems.push_back(dir + "/index.json: " + std::move(why));
    else
      ++more;
  };
  std::map<std::string, bool> seen;
  for (const auto& [key, t] : index["tensors"].items()) {
    const std::string kind = t.is_object() && t.contains("kind") && t["kind"].is_string()
                                 ? t["kind"].get<std::string>()
                                 : "model";
    const std::vector<int64_t> shape = t.at("shape").get<std::vector<int64_t>>();
    std::string name = key;
    if (kind != "model") {
      const size_t dot = key.rfind('.');
      name = dot == std::string::npos ? key : key.substr(0, dot);
    }
    const auto it = want.find(name);
    if (it == want.end()) {
      add("tensor " + key + ": not a tensor of the config's model" +
          (kind != "model" ? " (optimizer state of " + name + ")" : std::string()));
      continue;
    }
    if (it->second != shape)
      add("tensor " + key + ": shape " + shape_text(shape) + ", the config's model has " +
          shape_text(it->second));
    if (kind == "model") seen[name] = true;
  }
  for (const auto& [name, shape] : order)
    if (!seen.count(name)) add("tensor " + name + " " + shape_text(shape) + ": missing");
  if (more > 0) problems.push_back(dir + "/index.json: and " + std::to_string(more) + " more");
  return problems;
}

}  // namespace anvil::ckpt
