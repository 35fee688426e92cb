// The family registry and what every family computes the same way from its
// own GEMM list and shapes: FLOPs per token and the activations a block
// keeps for backward.
#include "anvil/model/family.hpp"

#include <algorithm>

#include "anvil/base/error.hpp"

namespace anvil::model {

std::span<const ModelFamily* const> model_families() {
  static const ModelFamily* const families[] = {&dense_family(), &zaya1_family()};
  return families;
}

const ModelFamily& model_family(Family id) {
  for (const ModelFamily* f : model_families()) {
    if (f->id() == id) return *f;
  }
  throw InputError("family: expected a registered model family, got " + to_string(id));
}

const ModelFamily& model_family(const ModelConfig& config) {
  return model_family(config.family);
}

FlopsPerToken ModelFamily::flops_per_token(const ModelConfig& c, int64_t T) const {
  // One sequence of T tokens, experts at balanced routing: each of the E
  // gets T * top_k / E rows, so the expert GEMMs cost top_k experts' worth
  // per token whatever the rounding of the rows.
  const int64_t per_expert = c.n_experts > 0 ? std::max<int64_t>(1, T * c.top_k / c.n_experts) : 0;
  const double tokens = static_cast<double>(T);
  FlopsPerToken f;
  for (const auto& g : layer_gemms(c, T, per_expert, false)) {
    double flops = g.flops() * static_cast<double>(c.n_layers);
    if (g.name.rfind("lm_head", 0) == 0) {
      flops = g.flops();
    } else if (g.name.rfind("expert.", 0) == 0) {
      flops = 2.0 * static_cast<double>(g.n) * static_cast<double>(g.k) * tokens *
              static_cast<double>(c.top_k) * static_cast<double>(c.n_layers);
    }
    f.gemm += flops / tokens;
  }
  f.attention =
      causal_attention_flops(c.head_dim, T) * static_cast<double>(c.n_heads * c.n_layers) / tokens;
  return f;
}


BlockActivations ModelFamily::saved_activations(const ModelConfig& c, bool expert_parallel) const {
  const double C = static_cast<double>(c.d_model);
  const double q = static_cast<double>(c.n_heads * c.head_dim);
  const double kv = static_cast<double>(c.n_kv_heads * c.head_dim);
  const double heads = static_cast<double>(c.n_heads);
  BlockActivations a;
  a.attention = 2 * C + q + 2 * kv + q + heads;  // x, norm out, q k v, attention out, lse
  if (c.n_experts == 0) {
    const double F = static_cast<double>(c.ffn_hidden);
    a.mlp = 2 * C + (c.mlp == Mlp::swiglu ? 3 * F : 2 * F);  // x, norm out, up, activation
    return a;
  }
  const double R = static_cast<double>(c.router_dim);
  const double Fe = static_cast<double>(c.expert_ffn_hidden);
  const double k = static_cast<double>(c.top_k);
  const double router = 6 * R + static_cast<double>(c.n_experts + 1);
  a.mlp = 2 * C + router + k * (2 * C + 3 * Fe);  // gathered input, gate|up, act, output
  // Under EP the rows an expert runs on arrive from the group and are kept
  // for backward beside the rank's own gathered rows (balanced: as many).
  if (expert_parallel) a.mlp += k * C;
  return a;
}

}  // namespace anvil::model
