// The shared pieces of the families' GEMM lists and the dispatch from a
// config to its family's.
#include "anvil/model/gemm_shapes.hpp"

#include "anvil/model/family.hpp"

namespace anvil::model {

void GemmList::linear(const std::string& name, int64_t tokens, int64_t in, int64_t out) {
  gemms_.push_back({name + ".fwd", tokens, out, in, false, true});
  if (backward_) {
    gemms_.push_back({name + ".dgrad", tokens, in, out, false, false});
    gemms_.push_back({name + ".wgrad", out, in, tokens, true, false});
  }
}

void ffn_gemms(GemmList& list, const ModelConfig& c, int64_t tokens, int64_t tokens_per_expert) {
  if (c.n_experts == 0) {
    const int64_t up = c.mlp == Mlp::swiglu ? 2 * c.ffn_hidden : c.ffn_hidden;
    list.linear("mlp.up", tokens, c.d_model, up);
    list.linear("mlp.down", tokens, c.ffn_hidden, c.d_model);
    return;
  }
  if (c.router_dim > 0) {
    list.linear("router.down", tokens, c.d_model, c.router_dim);
    // ZAYA1's router MLP: two hidden layers and the E experts + skip class.
    list.linear("router.mlp0", tokens, c.router_dim, c.router_dim);
    list.linear("router.mlp1", tokens, c.router_dim, c.router_dim);
    list.linear("router.mlp2", tokens, c.router_dim, c.n_experts + 1);
  } else {
    list.linear("router", tokens, c.d_model, c.n_experts);
  }
  const int64_t up = c.mlp == Mlp::swiglu ? 2 * c.expert_ffn_hidden : c.expert_ffn_hidden;
  list.linear("expert.up", tokens_per_expert, c.d_model, up);
  list.linear("expert.down", tokens_per_expert, c.expert_ffn_hidden, c.d_model);
}

std::vector<GemmShape> layer_gemms(const ModelConfig& config, int64_t tokens,
                                   int64_t tokens_per_expert, bool backward) {
  return model_family(config).layer_gemms(config, tokens, tokens_per_expert, backward);
}

FlopsPerToken flops_per_token(const ModelConfig& config, int64_t T) {
  return model_family(config).flops_per_token(config, T);
}

double training_flops_per_token(const ModelConfig& config, int64_t T) {
  return flops_per_token(config, T).training();
}

}  // namespace anvil::model
