// A model's shape, read from a JSON file under configs/ plus `key=value`
// overrides. Unknown keys and out-of-range values are errors that name the
// file and key. This is a pure description (no memory, no compute), so the
// benchmarks and the planner read it as well as the trainer. The string
// choices (mlp, norm, position, attention, skip_output, family) are parsed
// into enums here, once, so no other code compares config strings.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::model {

enum class Mlp { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class Position { learned, rope };
enum class Attention { mha, gqa, cca };
// ZAYA1: what the skip class outputs: gate * x (the original model) or 0
// (transformers' ZayaForCausalLM and later ports).
enum class SkipOutput { input, zero };
// The model family that builds a config (family.hpp): the dense decoder
// (GPT-2 and Llama shapes) or ZAYA1.
enum class Family { dense, zaya1 };

// The JSON spelling of each enum value, in declaration order: the one table
// that parsing, model_config_to_json and error messages read.
constexpr std::array<std::string_view, 2> names_of(Mlp) {
  return {"gelu", "swiglu"};
}
constexpr std::array<std::string_view, 2> names_of(Norm) {
  return {"layernorm", "rmsnorm"};
}
constexpr std::array<std::string_view, 2> names_of(Position) {
  return {"learned", "rope"};
}
constexpr std::array<std::string_view, 3> names_of(Attention) {
  return {"mha", "gqa", "cca"};
}
constexpr std::array<std::string_view, 2> names_of(SkipOutput) {
  return {"input", "zero"};
}
constexpr std::array<std::string_view, 2> names_of(Family) {
  return {"dense", "zaya1"};
}

template <typename E>
requires requires {
  names_of(E{});
}
std::string to_string(E value) {
  return std::string(names_of(E{})[static_cast<size_t>(value)]);
}

struct ModelConfig {
  std::string name = "unnamed";
  int64_t d_model = 768;
  int64_t n_layers = 12;    // blocks; with MoE each block = attention + MoE layer
  int64_t n_heads = 12;     // query heads
  int64_t n_kv_heads = 12;  // key/value heads (GQA when < n_heads)
  int64_t head_dim = 64;
  int64_t vocab_size = 50304;
  int64_t seq_len = 1024;
  int64_t ffn_hidden = 3072;  // dense MLP width (per branch for SwiGLU)
  Mlp mlp = Mlp::gelu;
  Norm norm = Norm::layernorm;
  Position position = Position::learned;
  Attention attention = Attention::mha;
  bool tied_embeddings = true;
  bool bias = true;             // biases on linear layers and LayerNorm (GPT-2 yes, Llama no)
  double norm_eps = 1e-5;       // LayerNorm / RMSNorm epsilon
  double rope_theta = 10000.0;  // RoPE base
  int64_t rotary_dim = 0;       // dims per head that RoPE rotates (0: all; partial rotary if less)
  // Mixture of experts (n_experts == 0: dense).
  int64_t n_experts = 0;
  int64_t expert_ffn_hidden = 0;  // per expert, per SwiGLU branch
  int64_t top_k = 1;
  int64_t router_dim = 0;  // ZAYA1 router down-projection width (0: linear router)
  // ZAYA1: init std of the router MLP's three matrices (docs/zaya1-spec.md section 8's
  // N(0, 0.02) by default; see docs/zaya1.md on balancing).
  double router_init_std = 0.02;
  // ZAYA1: the key temperature's initial value (1: attention over
  // QK-normalised heads from the first step; 0, the public port's: every
  // key zero, attention starts uniform and learns its sharpness).
  double key_temp_init = 1.0;
  // ZAYA1: multiplies the learning rate of the router's parameters (1: as
  // the rest). Below 1 the router's expert preferences move slower than the
  // balancing biases can follow (docs/zaya1.md, "Balancing").
  double router_lr_scale = 1.0;
  // ZAYA1: only a "zero" model exports to transformers' layout with the
  // same outputs.
  SkipOutput skip_output = SkipOutput::input;
  // The "family" key, or without it zaya1 for CCA attention and dense
  // otherwise (set once, at parse time).
  Family family = Family::dense;
};

// The family a config names nothing else for: zaya1 for CCA attention,
// dense otherwise.
Family default_family(Attention attention);

// Reads `path` and applies `overrides` ("key=value"). Throws InputError.
ModelConfig load_model_config(const std::string& path,
                              const std::vector<std::string>& overrides = {});

// Parses a JSON object text; `origin` names it in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& origin,
                               const std::vector<std::string>& overrides = {});

// The inverse of parse_model_config: every key, so a checkpoint records the
// exact shape it was trained with.
std::string model_config_to_json(const ModelConfig& config);

}  // namespace anvil::model
