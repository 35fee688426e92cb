#include "anvil/ckpt/hf.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/data/tokenizer_json.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/params.hpp"

namespace anvil::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

enum class Arch { zaya, gpt2, llama };

const char* architecture_name(Arch a) {
  switch (a) {
    case Arch::zaya: return "ZayaForCausalLM";
    case Arch::gpt2: return "GPT2LMHeadModel";
    case Arch::llama: return "LlamaForCausalLM";
  }
  return "?";
}

// The transformers architecture that computes exactly what `c` computes;
// InputError (naming `what`) when there is none.
Arch architecture_of(const model::ModelConfig& c, const std::string& what) {
  if (c.family == model::Family::zaya1) {
    if (c.skip_output != model::SkipOutput::zero) {
      throw InputError(what + ": this ZAYA1 model's skip class outputs gate * x (skip_output "
                       "\"input\", the original model); transformers' ZayaForCausalLM outputs 0 "
                       "there, so its logits would differ. Train with --set skip_output=zero, or "
                       "export --format original");
    }
    return Arch::zaya;
  }
  if (c.n_experts > 0) throw InputError(what + ": a MoE model without CCA has no export");
  const bool gpt2 = c.mlp == model::Mlp::gelu && c.norm == model::Norm::layernorm &&
                    c.position == model::Position::learned && c.bias && c.n_kv_heads == c.n_heads &&
                    c.n_heads * c.head_dim == c.d_model && c.tied_embeddings;
  if (gpt2) return Arch::gpt2;
  const bool full_rope = c.rotary_dim == 0 || c.rotary_dim == c.head_dim;
  if (c.mlp == model::Mlp::swiglu && c.norm == model::Norm::rmsnorm &&
      c.position == model::Position::rope && full_rope)
    return Arch::llama;
  throw InputError(
      what + ": config " + c.name + " (mlp " + model::to_string(c.mlp) + ", norm " +
      model::to_string(c.norm) + ", position " + model::to_string(c.position) + ", rotary_dim " +
      std::to_string(c.rotary_dim) +
      ") is neither GPT-2 shaped (gelu, layernorm, learned positions, biases, MHA, tied) nor "
      "Llama shaped (swiglu, rmsnorm, RoPE on the whole head)");
}

// One tensor of transformers' layout: anvil tensors `parts` concatenated
// along their first dimension (stacked under a new first dimension when
// `stack`), stored transposed as a 2-D matrix when `transpose` (GPT-2's
// Conv1D keeps [in, out]).
struct Mapped {
  std::string name;
  std::vector<std::string> parts;
  bool stack = false;
  bool transpose = false;
};

std::string L(int64_t layer, const std::string& rest) { return model::layer_param_name(layer, rest); }

// The whole mapping of one architecture (tensor order = file order).
std::vector<Mapped> tensor_map(const model::ModelConfig& c, Arch arch) {
  std::vector<Mapped> m;
  auto add = [&](const std::string& name, const std::string& part) { m.push_back({name, {part}}); };
  if (arch == Arch::zaya) {
    add("model.embed_tokens.weight", "model.embed_tokens.weight");
    add("model.input_hidden_states_scale", L(0, "res_scale.hidden_states_scale"));
    add("model.input_hidden_states_bias", L(0, "res_scale.hidden_states_bias"));
    auto res = [&](const std::string& to, const std::string& from) {
      for (const char* k : {"hidden_states_scale", "hidden_states_bias", "residual_scale",
                            "residual_bias"})
        add(to + k, from + k);
    };
    for (int64_t i = 0; i < c.n_layers; ++i) {
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
        Mapped s{p + (fc == std::string("linear_fc1") ? "mlp.experts.gate_up_proj"
                                                       : "mlp.experts.down_proj"),
                 {},
                 true};
        for (int64_t x = 0; x < c.n_experts; ++x)
          s.parts.push_back(L(e, "zaya_block.experts.local_experts." + std::to_string(x) + "." +
                                     fc + ".weight"));
        m.push_back(s);
      }
      // The merge that folds this block's MoE output in is the next
      // attention layer's, or the final one.
      res(p + "post_mlp_residual_scale.",
          i + 1 < c.n_layers ? L(2 * i + 2, "res_scale.") : "model.res_scale.");
    }
    add("model.norm.weight", "model.final_norm.weight");
    return m;
  }
  if (arch == Arch::gpt2) {
    add("transformer.wte.weight", "model.embed_tokens.weight");
    add("transformer.wpe.weight", "model.embed_positions.weight");
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      auto conv1d = [&](const std::string& to, const std::vector<std::string>& from) {
        Mapped w{to + ".weight", {}, false, true}, b{to + ".bias", {}};
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
    for (const char* k : {"weight", "bias"}) add(std::string("transformer.ln_f.") + k, std::string("model.norm.") + k);
    return m;
  }
  // Llama: anvil's dense names are Llama's.
  const auto registry = model::model_family(c).registry(c);
  for (const auto& spec : registry.specs()) add(spec.name, spec.name);
  return m;
}

// ZAYA1's original layout: anvil's own names (ZAYA1.md section 7).
std::vector<Mapped> identity_map(const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::vector<Mapped> m;
  for (const auto& [name, shape] : shapes) m.push_back({name, {name}});
  return m;
}

// Every anvil model tensor of `c` with its shape: the registry plus ZAYA1's
// balancing biases (model state outside the registry).
std::map<std::string, std::vector<int64_t>> anvil_shapes(const model::ModelConfig& c) {
  std::map<std::string, std::vector<int64_t>> s;
  const model::ModelFamily& family = model::model_family(c);
  const auto registry = family.registry(c);
  for (const auto& spec : registry.specs()) s[spec.name] = spec.shape;
  for (const auto& [name, shape] : family.extra_state_shapes(c)) s[name] = shape;
  return s;
}

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// The transformers shape of `t` from its parts' shapes.
std::vector<int64_t> mapped_shape(const Mapped& t,
                                  const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::vector<int64_t> first = shapes.at(t.parts.front()), shape;
  if (t.stack) {
    shape.push_back(static_cast<int64_t>(t.parts.size()));
    shape.insert(shape.end(), first.begin(), first.end());
    return shape;
  }
  shape = first;
  for (size_t i = 1; i < t.parts.size(); ++i) shape[0] += shapes.at(t.parts[i])[0];
  if (t.transpose) {
    const int64_t rows = shape[0], cols = count(shape) / rows;
    shape = {cols, rows};
  }
  return shape;
}

void transpose(float* out, const float* in, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) out[k * rows + r] = in[r * cols + k];
}

json hf_config(const model::ModelConfig& c, Arch arch, const std::string& dtype,
               const json& anvil) {
  const json none = nullptr;
  // The keys ZAYA1 and Llama share (transformers' decoder conventions).
  json j = {{"vocab_size", c.vocab_size},
            {"hidden_size", c.d_model},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},
            {"hidden_act", "silu"},
            {"max_position_embeddings", c.seq_len},
            {"rms_norm_eps", c.norm_eps}};
  if (arch == Arch::zaya) {
    const double rotary = c.rotary_dim > 0 ? static_cast<double>(c.rotary_dim) / c.head_dim : 1.0;
    j.update({{"model_type", "zaya"},
              {"tie_word_embeddings", true},
              {"moe_intermediate_size", c.expert_ffn_hidden},
              {"num_experts", c.n_experts},
              {"num_experts_per_tok", c.top_k},
              {"router_hidden_size", c.router_dim},
              {"cca_time0", 2},
              {"cca_time1", 2},
              {"attention_bias", false},
              {"lm_head_bias", false},
              {"rope_parameters",
               {{"hybrid",
                 {{"rope_type", "default"},
                  {"rope_theta", c.rope_theta},
                  {"partial_rotary_factor", rotary}}}}}});
  } else if (arch == Arch::gpt2) {
    j = {{"model_type", "gpt2"},
         {"vocab_size", c.vocab_size},
         {"n_positions", c.seq_len},
         {"n_embd", c.d_model},
         {"n_layer", c.n_layers},
         {"n_head", c.n_heads},
         {"n_inner", c.ffn_hidden},
         {"activation_function", "gelu_new"},  // tanh approximation, as anvil's
         {"layer_norm_epsilon", c.norm_eps},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"tie_word_embeddings", true}};
  } else {
    j.update({{"model_type", "llama"},
              {"intermediate_size", c.ffn_hidden},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
              {"tie_word_embeddings", c.tied_embeddings},
              {"attention_bias", c.bias},
              {"mlp_bias", c.bias}});
  }
  j["architectures"] = {architecture_name(arch)};
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  // anvil's tokenizers have no special tokens: none is claimed (an eos id
  // would stop greedy generation early).
  j["bos_token_id"] = none;
  j["eos_token_id"] = none;
  j["pad_token_id"] = none;
  j["dtype"] = dtype;
  j["anvil"] = anvil;
  return j;
}

// The config of ZAYA1's original alternating layout, as Zyphra's checkpoints
// have it (num_hidden_layers counts attention and MoE layers; RoPE, top-k
// and the expert width under their original keys), which transformers'
// convert_zaya_weights_to_hf.py reads.
json original_config(const model::ModelConfig& c, const std::string& dtype, const json& anvil) {
  json j = hf_config(c, Arch::zaya, dtype, anvil);
  j.erase("rope_parameters");
  j["num_hidden_layers"] = 2 * c.n_layers;
  j["rope_theta"] = c.rope_theta;
  j["partial_rotary_factor"] =
      c.rotary_dim > 0 ? static_cast<double>(c.rotary_dim) / c.head_dim : 1.0;
  j["ffn_hidden_size"] = c.expert_ffn_hidden;
  j["moe_router_topk"] = c.top_k;
  j["zaya_use_eda"] = true;
  j["residual_in_fp32"] = true;
  j["scale_residual_merge"] = true;
  return j;
}

// Creates `target`'s temporary sibling; `fill` writes into it; then fsync
// and rename, so `target` appears whole or not at all.
template <typename Fill>
void write_directory(const fs::path& target, Fill fill) {
  std::string tmp_name = ".";  // (append: GCC 12 warns falsely on "." + std::string)
  tmp_name.append(target.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
  const fs::path tmp = target.parent_path() / tmp_name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw SystemError(tmp.string() + ": cannot create directory: " + ec.message());
  try {
    fill(tmp);
    fsync_directory(tmp.string());
    fs::rename(tmp, target, ec);
    if (ec) throw SystemError(target.string() + ": cannot rename into place: " + ec.message());
    fsync_directory(target.parent_path().string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

ExportResult export_checkpoint(const ExportOptions& o) {
  if (o.format != "hf" && o.format != "original")
    throw InputError("--format: " + o.format + " (expected hf or original)");
  if (o.dtype != "float32" && o.dtype != "bfloat16")
    throw InputError("--dtype: " + o.dtype + " (expected float32 or bfloat16)");
  if (o.max_shard_bytes < 1) throw InputError("--max-shard-size: expected > 0 bytes");
  const std::string dir = resolve_checkpoint(o.checkpoint);
  const auto state = read_state(dir);
  const model::ModelConfig config =
      model::parse_model_config(state.at("config").dump(), dir + "/state.json");
  if (o.format == "original" && config.family != model::Family::zaya1)
    throw InputError("--format original: " + dir + " is a dense model; that layout is ZAYA1's");
  const Arch arch = o.format == "original" ? Arch::zaya : architecture_of(config, dir);
  std::error_code ec;
  if (fs::exists(o.out_dir, ec))
    throw InputError("--out: " + o.out_dir + " exists; expected a new directory");

  const auto tensors = read_tensors(dir, "model");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : tensors) shapes[name] = t.shape;
  const auto expected = anvil_shapes(config);
  for (const auto& [name, shape] : expected) {
    const auto it = shapes.find(name);
    if (it == shapes.end() || it->second != shape)
      throw InputError(dir + ": tensor " + name + " missing or of another shape than its config's");
  }
  const auto map = o.format == "original" ? identity_map(expected) : tensor_map(config, arch);

  // Each tensor's bytes in transformers' layout and dtype, in file order.
  const bool bf16 = o.dtype == "bfloat16";
  struct Out {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> f32;
    std::vector<uint16_t> b16;
    int64_t bytes() const { return count(shape) * (b16.empty() ? 4 : 2); }
  };
  std::vector<Out> out;
  ExportResult r;
  for (const auto& t : map) {
    Out x{t.name, mapped_shape(t, shapes), {}, {}};
    std::vector<float> cat;
    for (const auto& part : t.parts) {
      const auto& d = tensors.at(part).data;
      cat.insert(cat.end(), d.begin(), d.end());
    }
    if (t.transpose) {
      x.f32.resize(cat.size());
      transpose(x.f32.data(), cat.data(), x.shape[1], x.shape[0]);
    } else {
      x.f32 = std::move(cat);
    }
    if (bf16) {
      x.b16.resize(x.f32.size());
      for (size_t i = 0; i < x.f32.size(); ++i) x.b16[i] = to_bf16(x.f32[i]).bits;
      std::vector<float>().swap(x.f32);
    }
    r.parameters += count(x.shape);
    out.push_back(std::move(x));
  }
  r.tensors = static_cast<int64_t>(out.size());

  // Files of at most max_shard_bytes (a larger tensor gets a file alone).
  std::vector<std::vector<const Out*>> files(1);
  int64_t in_file = 0, total = 0;
  for (const auto& x : out) {
    if (in_file > 0 && in_file + x.bytes() > o.max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(&x);
    in_file += x.bytes();
    total += x.bytes();
  }
  r.files = static_cast<int64_t>(files.size());
  json anvil = {{"config", json::parse(model::model_config_to_json(config))},
                {"tokenizer", state.value("tokenizer", "random")},
                {"step", state.at("step")},
                {"source", dir},
                {"format", o.format}};
  const fs::path target = fs::absolute(o.out_dir);
  write_directory(target, [&](const fs::path& tmp) {
    json weight_map = json::object();
    for (size_t f = 0; f < files.size(); ++f) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
      const std::string file = files.size() == 1 ? "model.safetensors" : name;
      std::vector<TensorRef> refs;
      for (const Out* x : files[f]) {
        refs.push_back({x->name, x->shape, x->f32.data(), bf16 ? x->b16.data() : nullptr});
        weight_map[x->name] = file;
      }
      write_safetensors((tmp / file).string(), refs, {{"format", "pt"}});
    }
    if (files.size() > 1) {
      const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    }
    const json cfg = o.format == "original" ? original_config(config, o.dtype, anvil)
                                            : hf_config(config, arch, o.dtype, anvil);
    write_file_atomic((tmp / "config.json").string(), cfg.dump(2) + "\n");
    // The run's tokenizer, where transformers has an exact equivalent.
    json tokenizer;
    if (state.value("tokenizer", "") == "bytes" && config.vocab_size >= 256) {
      tokenizer = data::bytes_tokenizer_json();
    } else if (state.value("tokenizer", "") == "sentencepiece") {
      const std::string model = tokenizer_model(dir);
      if (!model.empty()) {
        tokenizer = data::sentencepiece_tokenizer_json(model);
        fs::copy_file(model, tmp / kTokenizerFile);
      }
      if (tokenizer.is_null())
        std::fprintf(stderr, "anvil: warning: %s: no tokenizer.json written (a SentencePiece "
                     "BPE model is needed)\n", dir.c_str());
    }
    if (!tokenizer.is_null()) {
      write_file_atomic((tmp / "tokenizer.json").string(), tokenizer.dump() + "\n");
      const json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                       {"model_max_length", config.seq_len},
                       {"clean_up_tokenization_spaces", false}};
      write_file_atomic((tmp / "tokenizer_config.json").string(), tc.dump(2) + "\n");
    }
  });
  r.out_dir = target.string();
  r.architecture = o.format == "original" ? "ZAYA1 original layout" : architecture_name(arch);
  return r;
}

namespace {

// An anvil config from transformers' config.json (or the exact one anvil
// put there on export).
model::ModelConfig config_from_hf(const json& j, const std::string& path, bool original,
                                  Arch& arch) {
  auto bad = [&](const std::string& why) { return InputError(path + ": " + why); };
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string())
    throw bad("no architectures list (expected [\"ZayaForCausalLM\"], [\"GPT2LMHeadModel\"] or "
              "[\"LlamaForCausalLM\"])");
  const std::string a = j["architectures"][0].get<std::string>();
  if (a == "ZayaForCausalLM") arch = Arch::zaya;
  else if (a == "GPT2LMHeadModel") arch = Arch::gpt2;
  else if (a == "LlamaForCausalLM") arch = Arch::llama;
  else
    throw bad("architecture " + a +
              " (expected ZayaForCausalLM, GPT2LMHeadModel or LlamaForCausalLM)");
  if (j.contains("anvil") && j["anvil"].is_object() && j["anvil"].contains("config"))
    return model::parse_model_config(j["anvil"]["config"].dump(), path + ": anvil.config");
  auto num = [&](const char* key) -> const json& {
    if (!j.contains(key) || !j[key].is_number()) throw bad(std::string("no number ") + key);
    return j[key];
  };
  auto opt = [&](const char* key, double fallback) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
  };
  auto opt_bool = [&](const char* key, bool fallback) {
    return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
  };
  // rope_parameters (transformers 5; per layer type for ZAYA) or rope_theta.
  auto rope = [&](const char* layer_type) -> json {
    json p = j.value("rope_parameters", json::object());
    if (layer_type && p.contains(layer_type)) p = p[layer_type];
    if (!p.is_object()) p = json::object();
    if (!p.contains("rope_theta") && j.contains("rope_theta")) p["rope_theta"] = j["rope_theta"];
    if (p.value("rope_type", std::string("default")) != "default")
      throw bad("rope_type " + p["rope_type"].dump() + " (anvil has the default RoPE only)");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
      throw bad("rope_scaling is set (anvil has the default RoPE only)");
    return p;
  };
  model::ModelConfig c;
  c.name = j.value("_name_or_path", std::string("imported-") + a);
  if (c.name.empty()) c.name = "imported";
  c.vocab_size = num("vocab_size").get<int64_t>();
  if (arch == Arch::gpt2) {
    c.d_model = num("n_embd").get<int64_t>();
    c.n_layers = num("n_layer").get<int64_t>();
    c.n_heads = c.n_kv_heads = num("n_head").get<int64_t>();
    c.head_dim = c.d_model / c.n_heads;
    c.seq_len = num("n_positions").get<int64_t>();
    c.ffn_hidden = j.contains("n_inner") && j["n_inner"].is_number() ? j["n_inner"].get<int64_t>()
                                                                      : 4 * c.d_model;
    const std::string act = j.value("activation_function", std::string("gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      throw bad("activation_function " + act + " (anvil's GELU is the tanh approximation, "
                "gelu_new)");
    c.norm_eps = opt("layer_norm_epsilon", 1e-5);
    c.family = model::Family::dense;
    c.mlp = model::Mlp::gelu;
    c.norm = model::Norm::layernorm;
    c.position = model::Position::learned;
    c.attention = model::Attention::mha;
    c.bias = true;
    c.tied_embeddings = true;
    return c;
  }
  c.d_model = num("hidden_size").get<int64_t>();
  c.n_layers = num("num_hidden_layers").get<int64_t>();
  c.n_heads = num("num_attention_heads").get<int64_t>();
  c.n_kv_heads = static_cast<int64_t>(opt("num_key_value_heads", static_cast<double>(c.n_heads)));
  c.head_dim = j.contains("head_dim") && j["head_dim"].is_number() ? j["head_dim"].get<int64_t>()
                                                                    : c.d_model / c.n_heads;
  c.seq_len = num("max_position_embeddings").get<int64_t>();
  c.norm_eps = opt("rms_norm_eps", 1e-6);
  c.mlp = model::Mlp::swiglu;
  c.norm = model::Norm::rmsnorm;
  c.position = model::Position::rope;
  c.bias = false;
  if (j.value("hidden_act", std::string("silu")) != "silu")
    throw bad("hidden_act " + j["hidden_act"].dump() + " (expected silu)");
  if (arch == Arch::zaya) {
    json p = rope("hybrid");
    if (original) {  // Zyphra's keys: layers counted singly, RoPE at the top
      if (c.n_layers % 2 != 0)
        throw bad("num_hidden_layers " + std::to_string(c.n_layers) +
                  " in the original layout (expected an even count: attention + MoE)");
      c.n_layers /= 2;
      if (j.contains("partial_rotary_factor")) p["partial_rotary_factor"] = j["partial_rotary_factor"];
    }
    c.rope_theta = p.contains("rope_theta") ? p["rope_theta"].get<double>() : 1e4;
    const double f = p.contains("partial_rotary_factor") ? p["partial_rotary_factor"].get<double>()
                                                         : 1.0;
    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * f);
    c.family = model::Family::zaya1;
    c.attention = model::Attention::cca;
    c.n_experts = num("num_experts").get<int64_t>();
    c.expert_ffn_hidden = num("moe_intermediate_size").get<int64_t>();
    c.ffn_hidden = c.expert_ffn_hidden;
    c.top_k = static_cast<int64_t>(opt("num_experts_per_tok", 1));
    c.router_dim = static_cast<int64_t>(opt("router_hidden_size", 256));
    c.tied_embeddings = opt_bool("tie_word_embeddings", true);
    c.skip_output = model::SkipOutput::zero;
    if (opt("cca_time0", 2) != 2 || opt("cca_time1", 2) != 2)
      throw bad("cca_time0/cca_time1 other than 2 (anvil's CCA convolutions have kernel 2)");
    if (j.value("sliding_window", json()).is_number())
      throw bad("sliding_window is set (anvil's CCA attention is full causal)");
    if (opt_bool("attention_bias", false) || opt_bool("lm_head_bias", false))
      throw bad("attention_bias / lm_head_bias (ZAYA1 has none)");
    return c;
  }
  const json p = rope(nullptr);
  c.rope_theta = p.contains("rope_theta") ? p["rope_theta"].get<double>() : 1e4;
  c.family = model::Family::dense;
  c.attention = c.n_kv_heads == c.n_heads ? model::Attention::mha : model::Attention::gqa;
  c.ffn_hidden = num("intermediate_size").get<int64_t>();
  c.tied_embeddings = opt_bool("tie_word_embeddings", false);
  const bool ab = opt_bool("attention_bias", false), mb = opt_bool("mlp_bias", false);
  if (ab != mb) throw bad("attention_bias and mlp_bias differ (anvil has one bias switch)");
  c.bias = ab;
  return c;
}

// Every tensor of a transformers checkpoint directory (one file or an index).
std::map<std::string, LoadedTensor> read_hf_weights(const fs::path& dir) {
  std::map<std::string, LoadedTensor> all;
  std::vector<std::string> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      j = json::parse(read_file(index.string()));
    } catch (const json::exception& e) {
      throw InputError(index.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw InputError(index.string() + ": no weight_map object");
    std::set<std::string> names;
    for (const auto& [k, v] : j["weight_map"].items()) {
      if (!v.is_string() || v.get<std::string>().find('/') != std::string::npos)
        throw InputError(index.string() + ": weight_map." + k + " is not a file name");
      names.insert(v.get<std::string>());
    }
    files.assign(names.begin(), names.end());
  } else {
    files = {"model.safetensors"};
  }
  for (const auto& f : files) {
    auto file = read_safetensors((dir / f).string());
    for (auto& [name, t] : file.tensors) all[name] = std::move(t);
  }
  return all;
}

// Buffers transformers (or older checkpoints) store that carry no weight.
bool ignorable(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const std::string e = s;
    return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with("rotary_emb.inv_freq");
}

}  // namespace

ImportResult import_hf(const std::string& hf_dir, const std::string& run_dir) {
  const fs::path dir(hf_dir);
  const std::string config_path = (dir / "config.json").string();
  json j;
  try {
    j = json::parse(read_file(config_path));
  } catch (const json::exception& e) {
    throw InputError(config_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw InputError(config_path + ": expected a JSON object");
  std::error_code ec;
  if (fs::exists(run_dir, ec) && !fs::is_empty(run_dir, ec))
    throw InputError("--out: " + run_dir + " exists and is not empty; expected a new run directory");
  auto weights = read_hf_weights(dir);
  // ZAYA1's original alternating layout names its experts one by one.
  const bool original =
      std::any_of(weights.begin(), weights.end(), [](const auto& w) {
        return w.first.find(".zaya_block.experts.local_experts.") != std::string::npos;
      });
  Arch arch = Arch::zaya;
  model::ModelConfig c;
  try {
    c = config_from_hf(j, config_path, original, arch);
  } catch (const json::exception& e) {
    throw InputError(config_path + ": " + e.what());
  }
  if (original && arch != Arch::zaya)
    throw InputError(hf_dir + ": ZAYA1 original-layout tensors under a " +
                     architecture_name(arch) + " config.json");
  const auto shapes = anvil_shapes(c);
  const auto map = original ? identity_map(shapes) : tensor_map(c, arch);
  // GPT-2 checkpoints from the Hub name tensors without the "transformer." prefix.
  auto find = [&](const std::string& name) -> std::map<std::string, LoadedTensor>::iterator {
    auto it = weights.find(name);
    if (it == weights.end() && name.rfind("transformer.", 0) == 0)
      it = weights.find(name.substr(12));
    return it;
  };
  std::map<std::string, std::vector<float>> anvil;
  ImportResult r;
  for (const auto& t : map) {
    const auto it = find(t.name);
    if (it == weights.end())
      throw InputError(hf_dir + ": tensor " + t.name + " is missing (expected by " +
                       architecture_name(arch) + ")");
    const auto want = mapped_shape(t, shapes);
    if (it->second.shape != want) {
      json got = it->second.shape, exp = want;
      throw InputError(hf_dir + ": tensor " + t.name + " has shape " + got.dump() + " (expected " +
                       exp.dump() + " from config.json)");
    }
    std::vector<float> cat = std::move(it->second.data);
    weights.erase(it);
    if (t.transpose) {
      std::vector<float> back(cat.size());
      transpose(back.data(), cat.data(), want[0], want[1]);
      cat = std::move(back);
    }
    size_t at = 0;
    for (const auto& part : t.parts) {
      const auto n = static_cast<size_t>(count(shapes.at(part)));
      anvil[part].assign(cat.begin() + static_cast<std::ptrdiff_t>(at),
                         cat.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
    }
    ++r.tensors;
    r.parameters += static_cast<int64_t>(cat.size());
  }
  for (const auto& [name, t] : weights) {
    if (ignorable(name)) continue;
    if (name == "lm_head.weight" && c.tied_embeddings) continue;  // the tied copy
    throw InputError(hf_dir + ": unexpected tensor " + name + " (not part of " +
                     architecture_name(arch) + " as its config.json describes it)");
  }

  // One rank writes everything: the registry's arena plus the extras.
  const auto registry = model::model_family(c).registry(c);
  std::vector<float> params(static_cast<size_t>(registry.total()));
  for (const auto& spec : registry.specs())
    std::copy(anvil.at(spec.name).begin(), anvil.at(spec.name).end(),
              params.begin() + spec.offset);
  ShardedSave save;
  save.model = registry.shards(params.data(), {{0, registry.total()}});
  for (auto& [name, data] : anvil) {
    if (registry.find(name)) continue;
    save.model.push_back({name, shapes.at(name), 0, static_cast<int64_t>(data.size()), 0,
                          model::Sharding::replicated, data.data()});
  }
  std::string tokenizer = "random";
  if (j.contains("anvil") && j["anvil"].is_object())
    tokenizer = j["anvil"].value("tokenizer", tokenizer);
  const json state = {{"format", "anvil-train-state"},
                      {"version", 1},
                      {"step", 0},
                      {"config", json::parse(model::model_config_to_json(c))},
                      {"seed", 0},
                      {"batch", 1},
                      {"seq", c.seq_len},
                      {"accum", 1},
                      {"tokenizer", tokenizer},
                      {"weights_only", true},
                      {"imported_from", fs::absolute(dir).string()},
                      {"architecture", architecture_name(arch)}};
  save.state_json = state.dump(2) + "\n";
  save.layout = {{"world", 1}, {"zero", false}, {"ep", 1}, {"optimizer", "none"}};
  fs::create_directories(run_dir, ec);
  if (ec) throw SystemError(run_dir + ": cannot create directory: " + ec.message());
  r.checkpoint_dir = save_sharded(run_dir, 0, save, SaveGroup{}, 1);
  r.config_path = (fs::path(run_dir) / "model-config.json").string();
  write_file_atomic(r.config_path, model::model_config_to_json(c) + "\n");
  r.architecture = original ? "ZAYA1 original layout" : architecture_name(arch);
  return r;
}

}  // namespace anvil::ckpt
