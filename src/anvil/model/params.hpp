// The parameter registry: every parameter's global name (Hugging Face style,
// e.g. model.layers.3.self_attn.q_proj.weight), global shape, init rule,
// weight-decay flag and sharding rule, and its offset in the flat parameter
// arena. Gradients and optimizer state use the same offsets in arenas of
// their own. Checkpoints, the optimizer and (later) ZeRO and expert
// parallelism all iterate this one list.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace anvil::model {

// How a parameter starts: N(0, init_std), all zeros, all ones, or all
// init_std (constant: a configured value, e.g. ZAYA1's key temperature).
enum class Init { normal, zeros, ones, constant };
// Which optimizer updates a parameter when the trainer runs Muon: the 2-D
// weight matrices inside the blocks (Muon), everything else — embeddings, the
// LM head, norms, biases, scales — AdamW. With plain AdamW every parameter
// is AdamW's.
enum class OptimizerGroup { adamw, muon };
// How a tensor is laid out across ranks: whole on every rank (replicated);
// split into flat ranges over the data-parallel ranks (zero_range: ZeRO-1's
// optimizer state, distributed Muon's momentum); or one expert's, owned by
// the expert-parallel rank that runs it and replicated over the
// expert-data-parallel group (expert).
enum class Sharding { replicated, zero_range, expert };

// One rank's piece of a global tensor, after Megatron-Core's ShardedTensor:
// the tensor's key and global shape, the piece as the flat row-major range
// [offset, offset + numel) of it, and its replica number (0: this rank's
// copy is the one saved; > 0: another rank saves the same elements).
// Checkpoints are written and read as lists of these (ckpt/sharded.hpp), so
// any layout loads what any other wrote.
struct TensorShard {
  std::string key;
  std::vector<int64_t> global_shape;
  int64_t offset = 0;
  int64_t numel = 0;
  int replica = 0;
  Sharding sharding = Sharding::replicated;
  float* data = nullptr;
};

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
  // Marks every parameter whose name contains `part` as sharded `sharding`.
  void set_sharding(const std::string& part, Sharding sharding);
  // The parameters' pieces inside the ascending arena ranges [begin, end)
  // of `arena` (laid out as the registry: a tensor at arena + offset), keyed
  // by name + `suffix`; `keep` (when set) picks the parameters.
  std::vector<TensorShard> shards(float* arena, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                  const std::string& suffix = "",
                                  const std::function<bool(const ParamSpec&)>& keep = {}) const;
  // Fills `params` from `seed`: each parameter draws from its own stream keyed
  // by its name, so init does not depend on the order of the registry.
  void initialize(float* params, uint64_t seed) const;

 private:
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in specs_
  int64_t total_ = 0;
};

// "model.layers.<layer>.<rest>": the Hugging Face prefix of a layer's parameters.
std::string layer_param_name(int64_t layer, const std::string& rest);

std::string to_string(Sharding sharding);
std::string to_string(OptimizerGroup group);

}  // namespace anvil::model
