#include "anvil/model/gemm_shapes.hpp"

namespace anvil::model {

std::vector<GemmShape> layer_gemms(const ModelConfig& c, int64_t tokens, int64_t tokens_per_expert,
                                   bool backward) {
  std::vector<GemmShape> out;
  // A linear layer y[t, out] = x[t, in] W[out, in]^T and, for training, its
  // backward: dx[t, in] = dy[t, out] W[out, in]; dW[out, in] = dy^T[out, t] x[t, in].
  auto linear = [&](const std::string& name, int64_t t, int64_t in, int64_t out_features) {
    out.push_back({name + ".fwd", t, out_features, in, false, true});
    if (backward) {
      out.push_back({name + ".dgrad", t, in, out_features, false, false});
      out.push_back({name + ".wgrad", out_features, in, t, true, false});
    }
  };
  const int64_t q = c.n_heads * c.head_dim;
  const int64_t kv = c.n_kv_heads * c.head_dim;
  if (c.attention == "cca") {
    // CCA: q and k projected into compressed heads; values come half from the
    // current token and half from the previous one (two half-width projections).
    linear("attn.q", tokens, c.d_model, q);
    linear("attn.k", tokens, c.d_model, kv);
    linear("attn.v", tokens, c.d_model, kv / 2);
    linear("attn.v_prev", tokens, c.d_model, kv / 2);
    // The grouped causal convolution (kernel 2, one group per head) on the
    // q|k channels: the work of a [tokens x (q+kv) x 2*head_dim] GEMM.
    linear("attn.conv", tokens, 2 * c.head_dim, q + kv);
  } else {
    linear("attn.qkv", tokens, c.d_model, q + 2 * kv);
  }
  linear("attn.out", tokens, q, c.d_model);
  if (c.n_experts == 0) {
    const int64_t up = c.mlp == "swiglu" ? 2 * c.ffn_hidden : c.ffn_hidden;
    linear("mlp.up", tokens, c.d_model, up);
    linear("mlp.down", tokens, c.ffn_hidden, c.d_model);
  } else {
    if (c.router_dim > 0) {
      linear("router.down", tokens, c.d_model, c.router_dim);
      // ZAYA1's router MLP: two hidden layers and the E experts + skip class.
      linear("router.mlp0", tokens, c.router_dim, c.router_dim);
      linear("router.mlp1", tokens, c.router_dim, c.router_dim);
      linear("router.mlp2", tokens, c.router_dim, c.n_experts + 1);
    } else {
      linear("router", tokens, c.d_model, c.n_experts);
    }
    const int64_t up = c.mlp == "swiglu" ? 2 * c.expert_ffn_hidden : c.expert_ffn_hidden;
    linear("expert.up", tokens_per_expert, c.d_model, up);
    linear("expert.down", tokens_per_expert, c.expert_ffn_hidden, c.d_model);
  }
  linear("lm_head", tokens, c.d_model, c.vocab_size);
  return out;
}

}  // namespace anvil::model
