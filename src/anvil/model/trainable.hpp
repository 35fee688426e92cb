// What the trainer needs from a model: the registry and flat parameter and
// gradient arrays, the memory plan, forward (loss) and forward+backward over
// a micro-batch, hooks for state beyond the parameters (ZAYA1's balancing
// biases: updated after each step, logged, checkpointed) and expert
// parallelism for a model with experts. Each model family (family.hpp)
// builds one; the trainer and evaluation hold only this interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/error.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/params.hpp"

namespace anvil::device {
class Stream;
}

namespace anvil::model {

class TokenDispatcher;  // zaya_dispatcher.hpp
struct ZayaMoeShape;

// Makes the token dispatcher of one MoE layer for N tokens per forward, at
// construction (expert parallelism: parallel/expert_parallel.hpp's
// all-to-all); empty: every expert runs locally.
using MakeDispatcher =
    std::function<std::unique_ptr<TokenDispatcher>(const ZayaMoeShape& shape, int64_t tokens)>;

// The experts a process holds: [first, first + count) of every MoE layer
// (count -1: all). Expert parallelism gives each rank of a group its share;
// their parameters keep their global names, so checkpoints stay global.
struct ExpertRange {
  int64_t first = 0;
  int64_t count = -1;
};

struct MemoryPlan {
  size_t parameters = 0;
  size_t gradients = 0;
  size_t activations = 0;
  size_t low_precision = 0;  // bf16 weight copy and conversion scratch (bf16 only)
};

// Named float buffers outside the registry (saved with the model's weights
// or the optimizer's state).
struct ExtraTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data;
  bool optimizer_state;  // true: optimizer state (index.json kind "optimizer"), else model
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  virtual const ParamRegistry& registry() const = 0;
  virtual float* params() = 0;
  // The same weights, for a caller that only reads them (a checkpoint's
  // save): unlike params() this leaves the bf16 copy fresh and a device's
  // copy current, so the next forward converts and uploads nothing.
  virtual float* params_for_reading() { return params(); }
  virtual float* grads() = 0;
  // bf16 training's copy of the weights (the registry's layout) while it
  // still matches them; nullptr without one, or once params() handed the
  // weights out for writing. An optimizer that rewrites the copy as it
  // updates the weights (AdamW::update's params_bf16) then calls
  // bf16_weights_refreshed(), and the next forward converts nothing.
  virtual bf16* fresh_bf16_weights() { return nullptr; }
  virtual void bf16_weights_refreshed() {}
  virtual const MemoryPlan& plan() const = 0;
  // Clears what the next forward_backward adds its gradients to (a model
  // may leave out the gradients its backward writes whole).
  virtual void zero_grads() = 0;
  virtual double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                         int64_t* scored) = 0;
  virtual double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                  int64_t T, float grad_scale, int64_t* scored) = 0;
  // Counters summed over the step's micro-batches that after_step reads
  // (ZAYA1: tokens per class per MoE layer). A data-parallel trainer sums
  // them over ranks before after_step, so every rank sees the global batch.
  virtual std::span<int64_t> step_counts() { return {}; }
  // After the optimizer step (ZAYA1: expert-bias balancing over the step's tokens).
  virtual void after_step(int64_t /*step, from 1*/) {}
  // Per-step metrics beyond the loss (ZAYA1: router load statistics).
  virtual nlohmann::json step_metrics() const { return nlohmann::json::object(); }
  // A short progress-line fragment ("" when none).
  virtual std::string progress_note() const { return ""; }
  virtual std::vector<ExtraTensor> extra_state() { return {}; }

  // Expert parallelism (the dispatchers come with the model's construction,
  // model/family.hpp's ModelOptions). has_experts: whether there are experts
  // to place on other ranks; take_dispatch_seconds: the seconds the
  // dispatchers spent communicating since the last call.
  virtual bool has_experts() const { return false; }
  virtual double take_dispatch_seconds() { return 0; }
  // Context parallelism: the seconds its K/V gathers and dK/dV
  // reduce-scatters, and its halo exchanges, spent communicating since the
  // last call.
  struct ContextSeconds {
    double kv = 0, halo = 0;
  };
  virtual ContextSeconds take_context_seconds() { return {}; }

  // A model whose parameters and gradients live in device memory
  // (DeviceDecoder): those arrays (the registry's flat layout) and the
  // stream ordering the work on them, for an optimizer that steps there
  // (optim/device_adamw.hpp). Null: params() and grads() are the model's own.
  struct DeviceArrays {
    device::Stream* stream;
    float* params;
    float* grads;
  };
  virtual const DeviceArrays* device_arrays() const { return nullptr; }
  // The optimizer steps on the device from now on: backward leaves the
  // gradients there (grads() copies them out when asked).
  virtual void keep_grads_on_device() {}
  // The optimizer wrote the device parameters: params() copies them out
  // before handing out the host array, and the model refreshes what it
  // derives from them (a bf16 copy).
  virtual void params_written_on_device() {}

  // Called during forward_backward with X as soon as every gradient at
  // offset >= X is final for this micro-batch (X decreases; the last call is
  // 0): the data-parallel trainer starts reducing those gradients while the
  // rest of backward runs. Empty: no calls. With the gradients kept on a
  // device (keep_grads_on_device), "final" means queued on its stream: a
  // reduction on another stream waits for an event recorded there.
  void set_grads_ready_hook(std::function<void(int64_t)> hook) { grads_ready_ = std::move(hook); }

 protected:
  void grads_ready_from(int64_t offset) const {
    if (grads_ready_) grads_ready_(offset);
  }

 private:
  std::function<void(int64_t)> grads_ready_;
};

}  // namespace anvil::model
