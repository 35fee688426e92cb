// A model family: one architecture behind one registered name, after
// torchtitan's TrainSpec. "dense" is the pre-norm decoder of the GPT-2 and
// Llama shapes (decoder.hpp), "zaya1" the CCA + MoE model (zaya_model.hpp).
// A family provides what the rest of anvil needs without naming it: the
// parameter registry, the memory plan, the training / evaluation model and
// the decoding model, the GEMM shapes of a block and the FLOPs per token
// they add up to (the one count the trainer's MFU, `anvil bench gemm
// --preset model` and the planner read), the parameter count and the
// activations the planner prices. docs/contributing.md lists the files a
// new family touches.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "anvil/device/runtime.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/context_parallel.hpp"
#include "anvil/model/gemm_shapes.hpp"
#include "anvil/model/param_count.hpp"
#include "anvil/model/params.hpp"
#include "anvil/model/precision.hpp"
#include "anvil/model/trainable.hpp"
#include "anvil/model/zaya_balancing.hpp"

namespace anvil::model {

// How to build a model: the largest micro-batch, whether it trains, the
// GEMM precision, the device its memory lives on, and for a family with
// experts their balancing and the experts this process holds. A family
// ignores what it has no use for; one without a path for the device
// refuses it (InputError).
struct ModelOptions {
  int64_t batch = 1;
  int64_t seq = 1;
  bool training = true;  // false: no gradient arena where the family can skip it
  Precision precision = Precision::fp32;
  Balancing balancing;
  ExpertRange experts;
  MakeDispatcher dispatcher;  // families with experts; empty: every expert local
  // Context parallelism (context_parallel.hpp): the group this rank splits
  // each sequence with; `seq` stays the whole sequence. Null: C = 1.
  ContextGroup* context = nullptr;
  // cuda: the dense family's DeviceDecoder (device_decoder.hpp), fp32, C = 1.
  device::DeviceKind device = device::DeviceKind::cpu;
  bool tf32 = false;  // cuda: matmuls in TensorFloat-32
};

// A model that decodes one token at a time with a cache (`anvil generate`).
class DecodingModel {
 public:
  virtual ~DecodingModel() = default;
  // The model whose registry, parameters and extra state a checkpoint fills.
  virtual TrainableModel& weights() = 0;
  // A cache for up to `max_len` positions, then decode_step for positions
  // 0, 1, 2, ...: feeds `token` at `pos` and writes the next-token logits [V].
  virtual void start_decode(int64_t max_len) = 0;
  virtual void decode_step(int32_t token, int64_t pos, float* logits) = 0;
};

// Elements per token that one block keeps for backward, by half (the
// planner's activation memory, before tensor and pipeline splits).
struct BlockActivations {
  double attention = 0;
  double mlp = 0;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  // The registered name, as the config's "family" key spells it.
  virtual Family id() const = 0;
  std::string name() const { return to_string(id()); }
  // Whether the family's models have experts (expert parallelism, --ep).
  virtual bool has_experts() const { return false; }

  // Every parameter (of the experts in `experts` only, for a family with
  // experts); InputError naming the config when the family cannot build it.
  virtual ParamRegistry registry(const ModelConfig& config, ExpertRange experts = {}) const = 0;
  // Model state saved with the weights outside the registry (ZAYA1's
  // balancing biases), by name, with its shape.
  virtual std::vector<std::pair<std::string, std::vector<int64_t>>> extra_state_shapes(
      const ModelConfig& /*config*/) const {
    return {};
  }
  // The bytes make_model(config, options) holds.
  virtual MemoryPlan memory_plan(const ModelConfig& config, const ModelOptions& options) const = 0;
  virtual std::unique_ptr<TrainableModel> make_model(const ModelConfig& config,
                                                     const ModelOptions& options) const = 0;
  // For one sequence, one token at a time, fp32, on `device` (InputError
  // where the family has no decoding model there).
  virtual std::unique_ptr<DecodingModel> make_decoding_model(const ModelConfig& config,
                                                             device::DeviceKind device) const = 0;

  // Parameters by component (`anvil size`, the planner).
  virtual ParamCount count_parameters(const ModelConfig& config) const = 0;
  // The GEMMs of one block at `tokens` tokens, expert GEMMs at
  // `tokens_per_expert`, then the classifier's; with `backward` each
  // GEMM's dgrad and wgrad follow it.
  virtual std::vector<GemmShape> layer_gemms(const ModelConfig& config, int64_t tokens,
                                             int64_t tokens_per_expert, bool backward) const = 0;
  // FLOPs per token at sequence length T, from layer_gemms at balanced
  // routing (top_k experts per token) plus causal attention.
  FlopsPerToken flops_per_token(const ModelConfig& config, int64_t T) const;
  // What one block keeps for backward; `expert_parallel`: the expert rows
  // received from other ranks are kept too.
  virtual BlockActivations saved_activations(const ModelConfig& config, bool expert_parallel) const;
  // The key/value head count the architecture fixes (0: free), for the
  // planner's resized candidates.
  virtual int64_t fixed_kv_heads() const { return 0; }
};

// Every registered family, in registration order.
std::span<const ModelFamily* const> model_families();
const ModelFamily& model_family(Family id);
// The family that builds `config` (its "family" key, parsed once).
const ModelFamily& model_family(const ModelConfig& config);

// A DecodingModel over a model class with start_decode and decode_step:
// each family's decoding model without a second class hierarchy.
template <typename Model>
class DecodingAdapter final : public DecodingModel {
 public:
  explicit DecodingAdapter(std::unique_ptr<Model> model) : model_(std::move(model)) {}
  TrainableModel& weights() override { return *model_; }
  void start_decode(int64_t max_len) override { model_->start_decode(max_len); }
  void decode_step(int32_t token, int64_t pos, float* logits) override {
    model_->decode_step(token, pos, logits);
  }

 private:
  std::unique_ptr<Model> model_;
};

// The registered families (family_dense.cpp, family_zaya1.cpp).
const ModelFamily& dense_family();
const ModelFamily& zaya1_family();

}  // namespace anvil::model
