// The GEMMs one transformer layer of a config runs, by name and shape: what
// `anvil bench gemm --preset model` measures and what the planner prices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"

namespace anvil::model {

struct GemmShape {
  std::string name;  // e.g. "qkv.fwd", "expert.up.wgrad"
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};

// Forward GEMMs of one block at `tokens` tokens (batch x sequence); expert
// GEMMs at `tokens_per_expert`. With `backward`, each GEMM's two backward
// GEMMs follow it (dgrad: dX = dY W, wgrad: dW = dY^T X).
std::vector<GemmShape> layer_gemms(const ModelConfig& config, int64_t tokens,
                                   int64_t tokens_per_expert, bool backward);

}  // namespace anvil::model
