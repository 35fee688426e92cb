// The dense family's Hugging Face adapter: GPT-2-shaped configs as
// GPT2LMHeadModel (Conv1D weights transposed, q/k/v fused into c_attn) and
// Llama-shaped ones as LlamaForCausalLM (anvil's dense names are Llama's).
#include "anvil/base/error.hpp"
#include "anvil/ckpt/hf_adapter.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/params.hpp"

namespace anvil::ckpt {
namespace {

using json = nlohmann::json;
using C = model::ModelConfig;

constexpr auto& L = model::layer_param_name;  // the maps name many layer tensors

std::vector<HfTensor> gpt2_tensors(const C& c) {
  std::vector<HfTensor> m;
  auto add = [&](const std::string& name, const std::string& part) { m.push_back({name, {part}}); };
  add("transformer.wte.weight", "model.embed_tokens.weight");
  add("transformer.wpe.weight", "model.embed_positions.weight");
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    auto conv1d = [&](const std::string& to, const std::vector<std::string>& from) {
      HfTensor w{to + ".weight", {}, false, true}, b{to + ".bias", {}};
      for (const auto& f : from) {
        w.parts.push_back(L(i, f + ".weight"));
        b.parts.push_back(L(i, f + ".bias"));
      }
      m.push_back(w);
      m.push_back(b);
    };
    for (const char* k : {"weight", "bias"}) add(p + "ln_1." + k, L(i, "input_layernorm.") + k);
    conv1d(p + "attn.c_attn", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"});
    conv1d(p + "attn.c_proj", {"self_attn.o_proj"});
    for (const char* k : {"weight", "bias"})
      add(p + "ln_2." + k, L(i, "post_attention_layernorm.") + k);
    conv1d(p + "mlp.c_fc", {"mlp.up_proj"});
    conv1d(p + "mlp.c_proj", {"mlp.down_proj"});
  }
  for (const char* k : {"weight", "bias"})
    add(std::string("transformer.ln_f.") + k, std::string("model.norm.") + k);
  return m;
}

const HfArchitecture& gpt2() {
  static const HfArchitecture arch{
      "GPT2LMHeadModel",
      hf_fixed(model::Family::dense, model::Mlp::gelu, model::Norm::layernorm,
               model::Position::learned,
               [](C& c) {
                 c.attention = model::Attention::mha;
                 c.bias = true;
                 c.tied_embeddings = true;
               }),
      {
          hf_constant("model_type", "gpt2"),
          hf_required("vocab_size", &C::vocab_size),
          hf_required("n_embd", &C::d_model),
          hf_required("n_layer", &C::n_layers),
          hf_required("n_head", &C::n_heads),
          hf_required("n_positions", &C::seq_len),
          hf_optional("n_inner", &C::ffn_hidden, [](const C& c) { return 4 * c.d_model; }),
          hf_checked(
              "activation_function", "gelu_new",  // tanh approximation, as anvil's
              [](const json& v) { return v == "gelu_new" || v == "gelu_pytorch_tanh"; },
              [](const json& v) {
                return "activation_function " + v.get<std::string>() +
                       " (anvil's GELU is the tanh approximation, gelu_new)";
              }),
          hf_optional("layer_norm_epsilon", &C::norm_eps, 1e-5),
          hf_constant("resid_pdrop", 0.0),
          hf_constant("embd_pdrop", 0.0),
          hf_constant("attn_pdrop", 0.0),
          hf_constant("scale_attn_weights", true),
          hf_constant("tie_word_embeddings", true),
      },
      [](C& c) {
        c.n_kv_heads = c.n_heads;
        c.head_dim = c.d_model / c.n_heads;
      },
      gpt2_tensors};
  return arch;
}

// Llama: bias on every linear layer or none (anvil has one switch).
std::vector<HfKey> llama_keys() {
  std::vector<HfKey> keys = transformers_decoder_keys();
  keys.push_back(hf_constant("model_type", "llama"));
  keys.push_back(hf_required("num_hidden_layers", &C::n_layers));
  keys.push_back({"rope_parameters",
                  [](const C& c) {
                    return json{{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
                  },
                  [](C& c, const json&, const HfSource& s) {
                    const json p = rope_parameters(s.doc, nullptr);
                    c.rope_theta = p.contains("rope_theta") ? p["rope_theta"].get<double>() : 1e4;
                  }});
  keys.push_back(hf_required("intermediate_size", &C::ffn_hidden));
  keys.push_back(hf_optional("tie_word_embeddings", &C::tied_embeddings, false));
  keys.push_back(hf_optional("attention_bias", &C::bias, false));
  keys.push_back({"mlp_bias", [](const C& c) { return json(c.bias); },
                  [](C& c, const json& v, const HfSource&) {
                    if ((v.is_boolean() && v.get<bool>()) != c.bias)
                      throw InputError(
                          "attention_bias and mlp_bias differ (anvil has one bias "
                          "switch)");
                  }});
  return keys;
}

const HfArchitecture& llama() {
  static const HfArchitecture arch{
      "LlamaForCausalLM",
      hf_fixed(model::Family::dense, model::Mlp::swiglu, model::Norm::rmsnorm,
               model::Position::rope, {}),
      llama_keys(),
      [](C& c) {
        c.attention = c.n_kv_heads == c.n_heads ? model::Attention::mha : model::Attention::gqa;
      },
      [](const C& c) {
        std::vector<HfTensor> m;
        const model::ParamRegistry registry = model::decoder_registry(c);
        for (const auto& spec : registry.specs()) m.push_back({spec.name, {spec.name}});
        return m;
      }};
  return arch;
}

const HfArchitecture& choose(const C& c, const std::string& what) {
  if (c.n_experts > 0) throw InputError(what + ": a MoE model without CCA has no export");
  const bool gpt2_shaped = c.mlp == model::Mlp::gelu && c.norm == model::Norm::layernorm &&
                           c.position == model::Position::learned && c.bias &&
                           c.n_kv_heads == c.n_heads && c.n_heads * c.head_dim == c.d_model &&
                           c.tied_embeddings;
  if (gpt2_shaped) return gpt2();
  const bool full_rope = c.rotary_dim == 0 || c.rotary_dim == c.head_dim;
  if (c.mlp == model::Mlp::swiglu && c.norm == model::Norm::rmsnorm &&
      c.position == model::Position::rope && full_rope)
    return llama();
  throw InputError(what + ": config " + c.name + " (mlp " + model::to_string(c.mlp) + ", norm " +
                   model::to_string(c.norm) + ", position " + model::to_string(c.position) +
                   ", rotary_dim " + std::to_string(c.rotary_dim) +
                   ") is neither GPT-2 shaped (gelu, layernorm, learned positions, biases, MHA, "
                   "tied) nor Llama shaped (swiglu, rmsnorm, RoPE on the whole head)");
}

}  // namespace

const HfAdapter& dense_hf_adapter() {
  static const HfAdapter adapter{model::Family::dense, {&gpt2(), &llama()}, choose, nullptr};
  return adapter;
}

}  // namespace anvil::ckpt
