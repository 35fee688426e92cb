// Parameter counts of a config, by component, total and active per token,
// with the vocabulary-sized matrices (token and position embeddings, an
// untied LM head) counted apart. Each model family counts its own
// (family.hpp): the dense decoder from the registry the trainer builds,
// ZAYA1 from its published layer shapes. Behind `anvil size`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/model/params.hpp"

namespace anvil::model {

struct ComponentCount {
  std::string component;
  int64_t total = 0;
  int64_t active = 0;  // used per token (top-k of the experts)
  bool embedding = false;
};

struct ParamCount {
  std::string model;
  std::string method;  // "registry" or "zaya1 spec"
  std::vector<ComponentCount> components;
  int64_t embedding = 0;
  int64_t non_embedding_total = 0;
  int64_t non_embedding_active = 0;
  int64_t total() const { return embedding + non_embedding_total; }
  int64_t active() const { return embedding + non_embedding_active; }
  std::string to_json() const;
  std::string text() const;
  // Fills embedding and the non-embedding sums from the components.
  void sum_components();
};

// The count of `config`'s family.
ParamCount count_parameters(const ModelConfig& config);

// A count from a registry's tensors, each in the component its name says
// (embeddings, attention, mlp, norms); `method` "registry".
ParamCount count_registry(const std::string& model, const ParamRegistry& registry);

}  // namespace anvil::model
