// AdamW (decoupled weight decay, bias correction) over the flat parameter
// arena, with the exact update order of torch.optim.AdamW so the two agree
// step for step; global-norm gradient clipping; learning-rate schedules.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/model/params.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::optim {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to parameters whose registry flag says so
};

class AdamW {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [begin, end) of the flat arena
  // skip_muon_group: leave the muon group to Muon (their moments stay zero).
  // owned: the ascending arena ranges this optimizer updates and keeps state
  // for (ZeRO-1: a rank's blocks, parallel/grad_reducer.hpp); empty: all of it.
  AdamW(const model::ParamRegistry& registry, AdamWConfig config, bool skip_muon_group = false,
        std::vector<Range> owned = {});
  // One step at learning rate `lr`; `step` counts from 1 (bias correction).
  // The gradients are multiplied by `grad_scale` as they are read (gradient
  // clipping without a separate pass over them). With `params_bf16` (a
  // bf16 copy of the arena, bf16 training's weights) each updated weight's
  // copy is rewritten as the weight is, a block at a time while the block
  // is in cache, by anvil::to_bf16 as kernels::convert_to_bf16 converts:
  // the same bits, without a second pass over the weights.
  void update(float* params, const float* grads, float lr, int64_t step, float grad_scale = 1.0f,
              bf16* params_bf16 = nullptr);
  // Bytes of the moments: 8 per element it updates (its owned ranges, less
  // the muon group when it skips it).
  size_t state_bytes() const { return m_.capacity() + v_.capacity(); }
  bool sharded() const { return sharded_; }
  // The state it keeps, by name: <param>.exp_avg and <param>.exp_avg_sq for
  // each parameter it updates, as the pieces inside its owned ranges
  // (ZeRO-1: zero-range shards) intersected with `within` (ascending arena
  // ranges; empty: all of them). Checkpoints save and load these.
  std::vector<model::TensorShard> state(const std::vector<Range>& within = {});
  const std::vector<Range>& owned() const { return owned_; }

  // A parameter's part it updates: arena [begin, end), its moments at
  // `local` in m and v (pieces back to back).
  struct Piece {
    const model::ParamSpec* spec;
    int64_t begin, end, local;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }
  // The moments (state_bytes() / 8 floats each), in pieces' order.
  float* exp_avg() { return reinterpret_cast<float*>(m_.base()); }
  float* exp_avg_sq() { return reinterpret_cast<float*>(v_.base()); }
  // A piece's constants at step `step` (from 1) and learning rate `lr`: its
  // lr scale and weight decay applied (optim/device_adamw.hpp steps with them too).
  kernels::body::AdamWStep constants(const Piece& piece, float lr, int64_t step) const;

 private:
  const model::ParamRegistry& registry_;
  AdamWConfig config_;
  std::vector<Range> owned_;
  bool sharded_;
  std::vector<Piece> pieces_;
  struct Block {  // a stretch of one piece, the unit of update()'s threads
    size_t piece;
    int64_t offset, size;
  };
  std::vector<Block> blocks_;
  tensor::Arena m_, v_;
};

// The L2 norm of all gradients, summed exactly (optim/square_sum.hpp): the
// same bits however the elements are split or ordered; NaN when one is NaN
// or infinite. `scale_hint`, where given, carries the fixed-point scale from
// one call to the next: while the largest magnitude stays within a factor
// of two of its power of two the call before (most steps of a run), one pass
// over the gradients instead of two, with the same bits.
double global_norm(const float* grads, int64_t n, std::optional<int>* scale_hint = nullptr);
// Sum of squares of grads[0, n) (global_norm squared).
double sum_of_squares(const float* grads, int64_t n, std::optional<int>* scale_hint = nullptr);
// The factor torch.nn.utils.clip_grad_norm_ scales gradients by so their
// global norm is at most max_norm: min(1, max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 (clipping off).
float clip_coefficient(double norm, double max_norm);

struct Schedule {
  std::string kind = "cosine";  // cosine | wsd | constant
  double lr = 3e-4;
  double min_lr_ratio = 0.1;    // the final lr as a fraction of lr
  int64_t warmup = 0;           // steps of linear warmup from 0
  int64_t total = 1;            // steps in the run
  double decay_fraction = 0.2;  // WSD: the final fraction of steps that decays
  int64_t start = 0;            // the step the schedule begins at (a recipe phase's first)
  // The learning rate at `step` (0-based, counted from the run's start).
  double at(int64_t step) const;
};

// Throws InputError naming `flag` for an unknown schedule.
void validate(const Schedule& schedule, const std::string& flag);

}  // namespace anvil::optim
