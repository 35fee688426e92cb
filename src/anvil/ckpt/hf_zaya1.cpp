// The zaya1 family's Hugging Face adapter: ZayaForCausalLM (transformers'
// native layout: one decoder layer per block, experts stacked) and ZAYA1's
// original alternating-layer layout (docs/zaya1-spec.md section 7), which Zyphra's
// checkpoints use and transformers' convert_zaya_weights_to_hf.py reads.
#include "anvil/base/error.hpp"
#include "anvil/ckpt/hf_adapter.hpp"
#include "anvil/model/params.hpp"

namespace anvil::ckpt {
namespace {

using json = nlohmann::json;
using C = model::ModelConfig;

constexpr auto& L = model::layer_param_name;  // the maps name many layer tensors

double rotary_fraction(const C& c) {
  return c.rotary_dim > 0 ? static_cast<double>(c.rotary_dim) / c.head_dim : 1.0;
}

// Block i of transformers' layout: anvil's attention layer 2i and MoE layer 2i + 1.
void zaya_block(std::vector<HfTensor>& m, const C& c, int64_t i) {
  auto add = [&](const std::string& name, const std::string& part) { m.push_back({name, {part}}); };
  auto res = [&](const std::string& to, const std::string& from) {
    for (const char* k :
         {"hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"})
      add(to + k, from + k);
  };
  const int64_t a = 2 * i, e = 2 * i + 1;
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const std::string q = L(a, "self_attn.qkv."), r = L(e, "zaya_block.router.");
  add(p + "input_layernorm.weight", L(a, "input_norm.weight"));
  add(p + "self_attn.qkv_proj.q_proj.weight", q + "linear_q.weight");
  add(p + "self_attn.qkv_proj.k_proj.weight", q + "linear_k.weight");
  add(p + "self_attn.qkv_proj.v_proj_current.weight", q + "val_proj1.weight");
  add(p + "self_attn.qkv_proj.v_proj_delayed.weight", q + "val_proj2.weight");
  for (const char* k : {"weight", "bias"}) {
    add(p + "self_attn.qkv_proj.conv_qk_depthwise." + k, q + "conv_qk.0." + k);
    add(p + "self_attn.qkv_proj.conv_qk_grouped." + k, q + "conv_qk.1." + k);
  }
  add(p + "self_attn.qk_norm.temp", q + "temp");
  add(p + "self_attn.o_proj.weight", L(a, "self_attn.o_proj.weight"));
  res(p + "post_attention_residual_scale.", L(e, "res_scale."));
  add(p + "post_attention_layernorm.weight", L(e, "input_norm.weight"));
  add(p + "mlp.gate.down_proj.weight", r + "down_proj.weight");
  add(p + "mlp.gate.down_proj.bias", r + "down_proj.bias");
  if (i > 0) add(p + "mlp.gate.router_states_scale", r + "router_states_scale");
  add(p + "mlp.gate.router_mlp.norm.weight", r + "rmsnorm_eda.weight");
  for (const char* k : {"weight", "bias"}) {
    add(p + "mlp.gate.router_mlp.fc1." + k, r + "router_mlp.0." + k);
    add(p + "mlp.gate.router_mlp.fc2." + k, r + "router_mlp.2." + k);
  }
  add(p + "mlp.gate.router_mlp.out_proj.weight", r + "router_mlp.4.weight");
  add(p + "mlp.gate.balancing_biases", r + "balancing_biases");
  for (const char* fc : {"linear_fc1", "linear_fc2"}) {
    HfTensor s{p + (fc == std::string("linear_fc1") ? "mlp.experts.gate_up_proj"
                                                    : "mlp.experts.down_proj"),
               {},
               true};
    for (int64_t x = 0; x < c.n_experts; ++x)
      s.parts.push_back(
          L(e, "zaya_block.experts.local_experts." + std::to_string(x) + "." + fc + ".weight"));
    m.push_back(s);
  }
  // The merge that folds this block's MoE output in is the next
  // attention layer's, or the final one.
  res(p + "post_mlp_residual_scale.",
      i + 1 < c.n_layers ? L(2 * i + 2, "res_scale.") : "model.res_scale.");
}

std::vector<HfTensor> zaya_tensors(const C& c) {
  std::vector<HfTensor> m;
  auto add = [&](const std::string& name, const std::string& part) { m.push_back({name, {part}}); };
  add("model.embed_tokens.weight", "model.embed_tokens.weight");
  add("model.input_hidden_states_scale", L(0, "res_scale.hidden_states_scale"));
  add("model.input_hidden_states_bias", L(0, "res_scale.hidden_states_bias"));
  for (int64_t i = 0; i < c.n_layers; ++i) zaya_block(m, c, i);
  add("model.norm.weight", "model.final_norm.weight");
  return m;
}

// A config.json check shared by two keys that must both hold.
HfKey both(const std::string& key, json value, std::function<bool(const json&)> accepts,
           const std::string& why) {
  return hf_checked(key, std::move(value), std::move(accepts), [why](const json&) { return why; });
}

std::vector<HfKey> zaya_keys() {
  std::vector<HfKey> keys = transformers_decoder_keys();
  keys.push_back(hf_constant("model_type", "zaya"));
  // The original layout counts attention and MoE layers singly.
  keys.push_back({"num_hidden_layers", [](const C& c) { return json(c.n_layers); },
                  [](C& c, const json& v, const HfSource& s) {
                    if (!v.is_number()) throw InputError("no number num_hidden_layers");
                    c.n_layers = hf_integer(v, "num_hidden_layers");
                    if (!s.original) return;
                    if (c.n_layers % 2 != 0)
                      throw InputError("num_hidden_layers " + std::to_string(c.n_layers) +
                                       " in the original layout (expected an even count: "
                                       "attention + MoE)");
                    c.n_layers /= 2;
                  }});
  keys.push_back({"rope_parameters",
                  [](const C& c) {
                    return json{{"hybrid",
                                 {{"rope_type", "default"},
                                  {"rope_theta", c.rope_theta},
                                  {"partial_rotary_factor", rotary_fraction(c)}}}};
                  },
                  [](C& c, const json&, const HfSource& s) {
                    json p = rope_parameters(s.doc, "hybrid");
                    // Zyphra's keys, and older transformers configs: RoPE's
                    // factor at the top.
                    if (!p.contains("partial_rotary_factor") &&
                        s.doc.contains("partial_rotary_factor"))
                      p["partial_rotary_factor"] = s.doc["partial_rotary_factor"];
                    // Absent, transformers' ZayaConfig takes its default
                    // parameters (theta 5e6, half of each head rotated);
                    // the original layout ZAYA1's own (theta 1e4 at 4k
                    // tokens, half of each head).
                    const bool defaults = !s.original && !s.doc.contains("rope_parameters") &&
                                          !s.doc.contains("rope_theta") &&
                                          !s.doc.contains("partial_rotary_factor");
                    c.rope_theta = p.contains("rope_theta") ? p["rope_theta"].get<double>()
                                   : defaults               ? 5e6
                                                            : 1e4;
                    const double f = p.contains("partial_rotary_factor")
                                         ? p["partial_rotary_factor"].get<double>()
                                     : defaults || s.original ? 0.5
                                                              : 1.0;
                    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * f);
                  }});
  keys.push_back(hf_required("num_experts", &C::n_experts));
  keys.push_back(hf_required("moe_intermediate_size", &C::expert_ffn_hidden));
  keys.push_back(hf_optional("num_experts_per_tok", &C::top_k, [](const C&) { return 1; }));
  keys.push_back(hf_optional("router_hidden_size", &C::router_dim, [](const C&) { return 256; }));
  keys.push_back(hf_optional("tie_word_embeddings", &C::tied_embeddings, true));
  const auto kernel2 = [](const json& v) { return !v.is_number() || v.get<double>() == 2; };
  const std::string conv =
      "cca_time0/cca_time1 other than 2 (anvil's CCA convolutions have kernel 2)";
  keys.push_back(both("cca_time0", 2, kernel2, conv));
  keys.push_back(both("cca_time1", 2, kernel2, conv));
  keys.push_back({"sliding_window", {}, [](C&, const json& v, const HfSource&) {
                    if (v.is_number())
                      throw InputError(
                          "sliding_window is set (anvil's CCA attention is full "
                          "causal)");
                  }});
  const auto unset = [](const json& v) { return !(v.is_boolean() && v.get<bool>()); };
  const std::string bias = "attention_bias / lm_head_bias (ZAYA1 has none)";
  keys.push_back(both("attention_bias", false, unset, bias));
  keys.push_back(both("lm_head_bias", false, unset, bias));
  return keys;
}

const HfArchitecture& zaya() {
  static const HfArchitecture arch{"ZayaForCausalLM",
                                   hf_fixed(model::Family::zaya1, model::Mlp::swiglu,
                                            model::Norm::rmsnorm, model::Position::rope,
                                            [](C& c) {
                                              c.attention = model::Attention::cca;
                                              c.bias = false;
                                              c.skip_output = model::SkipOutput::zero;
                                            }),
                                   zaya_keys(), [](C& c) { c.ffn_hidden = c.expert_ffn_hidden; },
                                   zaya_tensors};
  return arch;
}

// The original layout's config.json, as Zyphra's checkpoints have it
// (num_hidden_layers counts attention and MoE layers; RoPE, top-k and the
// expert width under their original keys).
json original_config(const C& c, json j) {
  j.erase("rope_parameters");
  j["num_hidden_layers"] = 2 * c.n_layers;
  j["rope_theta"] = c.rope_theta;
  j["partial_rotary_factor"] = rotary_fraction(c);
  j["ffn_hidden_size"] = c.expert_ffn_hidden;
  j["moe_router_topk"] = c.top_k;
  j["zaya_use_eda"] = true;
  j["residual_in_fp32"] = true;
  j["scale_residual_merge"] = true;
  return j;
}

const HfOriginalLayout& original() {
  static const HfOriginalLayout layout{"ZAYA1", &zaya(),
                                       // The original layout names its experts one by one.
                                       [](const std::string& tensor) {
                                         return tensor.find(".zaya_block.experts.local_experts.") !=
                                                std::string::npos;
                                       },
                                       original_config};
  return layout;
}

const HfArchitecture& choose(const C& c, const std::string& what) {
  if (c.skip_output != model::SkipOutput::zero) {
    throw InputError(what +
                     ": this ZAYA1 model's skip class outputs gate * x (skip_output "
                     "\"input\", the original model); transformers' ZayaForCausalLM outputs 0 "
                     "there, so its logits would differ. Train with --set skip_output=zero, or "
                     "export --format original");
  }
  return zaya();
}

}  // namespace

const HfAdapter& zaya1_hf_adapter() {
  static const HfAdapter adapter{model::Family::zaya1, {&zaya()}, choose, &original()};
  return adapter;
}

}  // namespace anvil::ckpt
