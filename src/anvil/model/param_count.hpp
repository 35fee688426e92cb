// Parameter counts of a config, by component, total and active per token,
// with the vocabulary-sized matrices (token and position embeddings, an
// untied LM head) counted apart. Dense decoders are counted from the
// registry the trainer builds; ZAYA1 (CCA attention + MoE with the router's
// skip class, ../shared/ZAYA1.md) from its published layer shapes until its
// layers are built. Behind `anvil size`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"

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
};

ParamCount count_parameters(const ModelConfig& config);

}  // namespace anvil::model
