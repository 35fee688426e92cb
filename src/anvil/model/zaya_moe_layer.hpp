// ZAYA1's MoE layer (docs/zaya1-spec.md section 4), training form, top-k (k = 1 is
// ZAYA1's), as four pieces with narrow interfaces (after Megatron-Core's
// moe_layer.py):
//   router      (zaya_router.hpp): x -> top-k classes of E experts + skip,
//               their gates, and the router state for the next MoE layer;
//   dispatcher  (zaya_dispatcher.hpp): the assignments sorted by expert, the
//               rows of this process's experts delivered (locally, or by an
//               all-to-all under expert parallelism) and their outputs back;
//   experts     (zaya_experts.hpp): SwiGLU, grouped GEMMs per expert segment;
//   combine     (kernels/moe.hpp): out = sum_j gate_j * E_choice_j(x), with
//               gate * x (or 0) for the skip class.
// Expert parallelism swaps the dispatcher and nothing else.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "anvil/kernels/layers.hpp"
#include "anvil/model/carver.hpp"
#include "anvil/model/zaya_dispatcher.hpp"
#include "anvil/model/zaya_experts.hpp"
#include "anvil/model/zaya_moe_shape.hpp"
#include "anvil/model/zaya_router.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::model {

class ZayaMoeLayer {
 public:
  // Backward scratch: the MoE layers of one model run their backward passes
  // one at a time and share one set.
  struct Scratch {
    ZayaRouter::Scratch router;
    float *dgate, *dys, *dxs;
    void carve(Carver& c, const ZayaMoeShape& s, int64_t tokens);
  };
  // N tokens per forward; `dispatcher` delivers the experts' rows. Holds no
  // memory until carve() (the model's arena).
  ZayaMoeLayer(ZayaMoeShape shape, int64_t N, RouterLossCoefs losses,
               std::unique_ptr<TokenDispatcher> dispatcher);
  // A layer outside a model (tests, parity dumps): every expert here and an
  // arena of its own with all its buffers.
  ZayaMoeLayer(ZayaMoeShape shape, int64_t N, RouterLossCoefs losses = {});
  // Takes the layer's activations from `c`; backward uses `shared`.
  void carve(Carver& c, const Scratch& shared);

  // out [N, H]; rstate_out [N, R] (the pre-norm router state for the next
  // MoE layer); rstate_prev [N, R] or null (first MoE layer). balancing_bias
  // [E + 1] steers selection only.
  void forward(float* out, float* rstate_out, const float* x, const float* rstate_prev,
               const ZayaMoeParams& p, const float* balancing_bias);
  // Adds gradients of sum(out * dout) + sum(rstate_out * drstate_out) to dx,
  // drstate_prev (when rstate_prev was given) and the gradient arena g.
  // loss_scale multiplies the router losses' gradient (the trainer's
  // gradient scale, as dout already carries it).
  void backward(float* dx, float* drstate_prev, const ZayaMoeParams& g, const float* dout,
                const float* drstate_out, const float* x, const float* rstate_prev,
                const ZayaMoeParams& p, float loss_scale = 1.0f);
  const RouterStats& stats() const { return router_.stats(); }
  std::span<const int32_t> choices() const { return router_.choices(); }  // [N, top_k]
  // bf16 expert GEMMs (--precision bf16): the weight arena's copy and the
  // model's conversion scratch; the router stays fp32.
  void set_bf16(const kernels::Bf16Weights* weights, kernels::Bf16Scratch* scratch) {
    low_ = weights;
    dispatcher_->set_bf16_scratch(scratch);
  }
  TokenDispatcher& dispatcher() { return *dispatcher_; }
  const ZayaMoeShape& shape() const { return s_; }

 private:
  ZayaMoeShape s_;
  int64_t N_;
  ZayaRouter router_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  const kernels::Bf16Weights* low_ = nullptr;
  Scratch back_{};
  // The standalone layer's.
  LocalDispatcher::Scratch own_local_{};
  tensor::Arena own_;
};

}  // namespace anvil::model
