// The GEMMs one transformer block of a config runs, by name and shape, and
// the FLOPs per token they add up to: what `anvil bench gemm --preset
// model` measures, what the planner prices and what the trainer's MFU
// divides by. Each model family lists its own block (family.hpp); the
// pieces the families share (a linear layer's three GEMMs, the MLP or MoE
// half, causal attention's FLOPs) are here.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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
// GEMMs follow it (dgrad: dX = dY W, wgrad: dW = dY^T X). The config's
// family lists them.
std::vector<GemmShape> layer_gemms(const ModelConfig& config, int64_t tokens,
                                   int64_t tokens_per_expert, bool backward);

// FLOPs per token of the model (forward); training = 3x (backward = 2x forward).
struct FlopsPerToken {
  double gemm = 0;       // weight GEMMs incl. the classifier and the router
  double attention = 0;  // QK^T + PV, causal
  double forward() const { return gemm + attention; }
  double training() const { return 3 * forward(); }
};

// At sequence length T, from the config family's GEMMs (balanced routing:
// top_k experts per token) and causal attention.
FlopsPerToken flops_per_token(const ModelConfig& config, int64_t T);

// The training FLOPs per token the trainer's MFU divides by: the same count
// the planner prices, flops_per_token(config, T).training().
double training_flops_per_token(const ModelConfig& config, int64_t T);

// Causal attention of one (sequence, head) of T tokens: query t sees t + 1
// keys, 2 FLOPs x (QK^T + PV) x head_dim per key.
inline double causal_attention_flops(int64_t head_dim, int64_t T) {
  return 4.0 * static_cast<double>(head_dim) * static_cast<double>(T) *
         (static_cast<double>(T) + 1) / 2;
}

// Builds a block's GEMM list: a linear layer y[t, out] = x[t, in] W[out, in]^T
// and, for training, its backward: dx[t, in] = dy[t, out] W[out, in];
// dW[out, in] = dy^T[out, t] x[t, in].
class GemmList {
 public:
  explicit GemmList(bool backward) : backward_(backward) {}
  void linear(const std::string& name, int64_t tokens, int64_t in, int64_t out);
  std::vector<GemmShape> take() { return std::move(gemms_); }

 private:
  bool backward_;
  std::vector<GemmShape> gemms_;
};

// The feed-forward half of a block: the dense MLP (n_experts 0) or the
// router (ZAYA1's router MLP when router_dim > 0) and the experts.
void ffn_gemms(GemmList& list, const ModelConfig& config, int64_t tokens,
               int64_t tokens_per_expert);

}  // namespace anvil::model
