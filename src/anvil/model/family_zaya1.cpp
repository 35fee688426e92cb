// The "zaya1" family: ZAYA1 (zaya_model.hpp), 2L layers alternating CCA
// attention and MoE with the router's skip class, its experts shardable
// over expert-parallel ranks. Parameters are counted from the published
// layer shapes (docs/zaya1-spec.md sections 1, 3, 4, 5, 7), which
// `configs/zaya1-base.json` matches to the parameter.
#include <memory>

#include "anvil/base/error.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/zaya_model.hpp"

namespace anvil::model {
namespace {

// Per block one CCA layer and one MoE layer.
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
  out.sum_components();
  return out;
}

class Zaya1Family final : public ModelFamily {
 public:
  Family id() const override { return Family::zaya1; }
  bool has_experts() const override { return true; }

  ParamRegistry registry(const ModelConfig& config, ExpertRange experts) const override {
    return zaya_registry(config, experts);
  }

  // The expert-selection biases of each MoE layer (odd layers), E + 1 each.
  std::vector<std::pair<std::string, std::vector<int64_t>>> extra_state_shapes(
      const ModelConfig& c) const override {
    std::vector<std::pair<std::string, std::vector<int64_t>>> out;
    for (int64_t i = 0; i < c.n_layers; ++i) {
      out.push_back(
          {layer_param_name(2 * i + 1, "zaya_block.router.balancing_biases"), {c.n_experts + 1}});
    }
    return out;
  }

  // ZayaModel sizes its buffers as it builds them, so its plan is a built
  // model's.
  MemoryPlan memory_plan(const ModelConfig& config, const ModelOptions& o) const override {
    return make_model(config, o)->plan();
  }

  std::unique_ptr<TrainableModel> make_model(const ModelConfig& config,
                                             const ModelOptions& o) const override {
    if (o.device != device::DeviceKind::cpu)
      throw InputError("--device " + device::to_string(o.device) +
                       ": zaya1 has no GPU path yet (the dense family, gpt2 and llama configs, "
                       "trains on cuda)");
    return std::make_unique<ZayaModel>(config, o.batch, o.seq, o.balancing, o.experts, o.precision,
                                       o.dispatcher, o.context);
  }

  // CCA caches; the router's balancing biases come with the checkpoint.
  std::unique_ptr<DecodingModel> make_decoding_model(const ModelConfig& config,
                                                     device::DeviceKind device) const override {
    if (device != device::DeviceKind::cpu)
      throw InputError("--device " + device::to_string(device) +
                       ": zaya1 has no GPU path yet (expected --device cpu)");
    return std::make_unique<DecodingAdapter<ZayaModel>>(std::make_unique<ZayaModel>(config, 1, 1));
  }

  ParamCount count_parameters(const ModelConfig& config) const override {
    return count_zaya1(config);
  }

  std::vector<GemmShape> layer_gemms(const ModelConfig& c, int64_t tokens,
                                     int64_t tokens_per_expert, bool backward) const override {
    const int64_t q = c.n_heads * c.head_dim;
    const int64_t kv = c.n_kv_heads * c.head_dim;
    GemmList list(backward);
    // CCA: q and k projected into compressed heads; values come half from the
    // current token and half from the previous one (two half-width projections).
    list.linear("attn.q", tokens, c.d_model, q);
    list.linear("attn.k", tokens, c.d_model, kv);
    list.linear("attn.v", tokens, c.d_model, kv / 2);
    list.linear("attn.v_prev", tokens, c.d_model, kv / 2);
    // The grouped causal convolution (kernel 2, one group per head) on the
    // q|k channels: the work of a [tokens x (q+kv) x 2*head_dim] GEMM.
    list.linear("attn.conv", tokens, 2 * c.head_dim, q + kv);
    list.linear("attn.out", tokens, q, c.d_model);
    ffn_gemms(list, c, tokens, tokens_per_expert);
    list.linear("lm_head", tokens, c.d_model, c.vocab_size);
    return list.take();
  }

  BlockActivations saved_activations(const ModelConfig& c, bool expert_parallel) const override {
    BlockActivations a = ModelFamily::saved_activations(c, expert_parallel);
    const double C = static_cast<double>(c.d_model);
    const double q = static_cast<double>(c.n_heads * c.head_dim);
    const double kv = static_cast<double>(c.n_kv_heads * c.head_dim);
    a.attention += 2 * (q + kv);  // both convolutions' outputs
    // The residual-scaling merges (h + hb) * hs + (r + rb) * rs: their
    // backward needs each layer's output h besides the residual r.
    a.attention += C;
    a.mlp += C;
    return a;
  }

  // Two: the current token's values and the previous token's.
  int64_t fixed_kv_heads() const override { return 2; }
};

}  // namespace

const ModelFamily& zaya1_family() {
  static const Zaya1Family family;
  return family;
}

}  // namespace anvil::model
