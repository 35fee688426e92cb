// The MoE layer's forward and backward: router, dispatcher, experts and
// combine in that order, and back.
#include "anvil/model/zaya_moe_layer.hpp"

#include <algorithm>

#include "anvil/base/step_parts.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/moe.hpp"

namespace anvil::model {

void ZayaMoeLayer::Scratch::carve(Carver& c, const ZayaMoeShape& s, int64_t tokens) {
  const int64_t A = tokens * s.top_k;  // assignments
  router.carve(c, s, tokens);
  dgate = c.take<float>(A);
  dys = c.take<float>(A * s.hidden);
  dxs = c.take<float>(A * s.hidden);
}

ZayaMoeLayer::ZayaMoeLayer(ZayaMoeShape shape, int64_t N, RouterLossCoefs losses,
                           std::unique_ptr<TokenDispatcher> dispatcher)
    : s_(shape), N_(N), router_(shape, N, losses), dispatcher_(std::move(dispatcher)) {}

ZayaMoeLayer::ZayaMoeLayer(ZayaMoeShape shape, int64_t N, RouterLossCoefs losses)
    : ZayaMoeLayer(shape, N, losses, nullptr) {
  dispatcher_ = std::make_unique<LocalDispatcher>(s_, N_, &own_local_);
  own_ = carve_arena("moe layer", [&](Carver& c) {
    own_local_.carve(c, s_, N_);
    Scratch scratch{};
    scratch.carve(c, s_, N_);
    carve(c, scratch);
  });
}

void ZayaMoeLayer::carve(Carver& c, const Scratch& shared) {
  router_.carve(c, shared.router);
  dispatcher_->carve(c);
  back_ = shared;
}

void ZayaMoeLayer::forward(float* out, float* rstate_out, const float* x, const float* rstate_prev,
                           const ZayaMoeParams& p, const float* balancing_bias) {
  router_.forward(rstate_out, x, rstate_prev, p.router, balancing_bias);
  const ExpertRows& rows = dispatcher_->dispatch(x, router_.choices().data());
  {
    const StepPartScope part(StepPart::experts);
    experts_forward(rows, s_, p.experts, low_);
  }
  kernels::moe_combine_forward(out, dispatcher_->gather_outputs(), x, router_.gates(),
                               dispatcher_->slots(), s_.skip_identity, N_, s_.top_k, s_.hidden);
}

void ZayaMoeLayer::backward(float* dx, float* drstate_prev, const ZayaMoeParams& g,
                            const float* dout, const float* drstate_out, const float* x,
                            const float* rstate_prev, const ZayaMoeParams& p, float loss_scale) {
  const int64_t H = s_.hidden, k = s_.top_k;
  // Combine, experts, dispatch, then the router: only through the gates.
  float* dys = back_.dys;
  float* dgate = back_.dgate;
  // The combine's backward writes every sorted row of dys (once each).
  std::fill(dgate, dgate + N_ * k, 0.0f);
  kernels::moe_combine_backward(dys, dgate, dx, dout, dispatcher_->outputs(), x, router_.gates(),
                                dispatcher_->slots(), s_.skip_identity, N_, k, H);
  const ExpertGrads& d = dispatcher_->dispatch_grads(dys, back_.dxs);
  {
    const StepPartScope part(StepPart::experts);
    experts_backward(d, dispatcher_->expert_rows(), s_, g.experts, p.experts, low_);
  }
  dispatcher_->gather_grads(dx);
  router_.backward(dx, drstate_prev, g.router, dgate, drstate_out, x, rstate_prev, p.router,
                   loss_scale);
}

}  // namespace anvil::model
