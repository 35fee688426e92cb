// The parameter registry: every parameter's global name (Hugging Face style,
// e.g. model.layers.3.self_attn.q_proj.weight), global shape, init rule,
// weight-decay flag and sharding rule, and its offset in the flat parameter
// arena. Gradients and optimizer state use the same offsets in arenas of
// their own. Checkpoints, the optimizer and (later) ZeRO and expert
// parallelism all iterate this one list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anvil::model {

enum class Init { normal, zeros, ones };
// Which optimizer updates a parameter when the trainer runs Muon: the 2-D
// weight matrices inside the blocks (Muon), everything else — embeddings, the
// LM head, norms, biases, scales — AdamW. With plain AdamW every parameter
// is AdamW's.
enum class OptimizerGroup { adamw, muon };
// How a parameter is laid out across ranks. Only replicated exists so far;
// expert-axis and ZeRO flat ranges are the next rules to add.
enum class Sharding { replicated };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init = Init::normal;
  float init_std = 0.02f;
  bool weight_decay = true;
  Sharding sharding = Sharding::replicated;
  OptimizerGroup group = OptimizerGroup::adamw;
  // Multiplies the learning rate (and so the weight decay) of this parameter.
  float lr_scale = 1.0f;
  int64_t offset = 0;  // floats from the start of the arena
  int64_t numel = 0;
  int64_t layer = -1;  // N for "model.layers.N.*", else -1
};

class ParamRegistry {
 public:
  // Parameters are laid out in the order they are added, with no padding, so
  // consecutive adds are contiguous (the trainer fuses q/k/v that way).
  const ParamSpec& add(std::string name, std::vector<int64_t> shape, Init init,
                       float init_std = 0.0f, bool weight_decay = false,
                       OptimizerGroup group = OptimizerGroup::adamw);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  // Throws InputError naming the parameter when absent.
  const ParamSpec& get(const std::string& name) const;
  const ParamSpec* find(const std::string& name) const;
  // The smallest offset of layer `layer`'s parameters (total() when none):
  // where backward's gradients are final once it has passed that layer.
  int64_t layer_begin(int64_t layer) const;
  // Sets lr_scale of every parameter whose name contains `part`.
  void scale_lr(const std::string& part, float scale);
  // Fills `params` from `seed`: each parameter draws from its own stream keyed
  // by its name, so init does not depend on the order of the registry.
  void initialize(float* params, uint64_t seed) const;

 private:
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

// "model.layers.<layer>.<rest>": the Hugging Face prefix of a layer's parameters.
std::string layer_param_name(int64_t layer, const std::string& rest);

std::string to_string(Sharding sharding);
std::string to_string(OptimizerGroup group);

}  // namespace anvil::model
