// The token dispatcher's sorted order (kernels/moe: dispatch, gather and
// their backward) and the local exchange, which hands the sorted rows to the
// experts as they are.
#include "anvil/model/zaya_dispatcher.hpp"

#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/moe.hpp"

namespace anvil::model {

TokenDispatcher::TokenDispatcher(const ZayaMoeShape& shape, int64_t tokens)
    : s_(shape), N_(tokens) {}

void TokenDispatcher::carve(Carver& c) {
  const int64_t A = N_ * s_.top_k;
  order_ = c.take<int32_t>(A);
  slot_ = c.take<int32_t>(A);
  offsets_ = c.take<int64_t>(s_.experts + 1);
  xs_ = c.take<float>(A * s_.hidden);
  ys_ = c.take<float>(A * s_.hidden);
  carve_own(c);
}

const ExpertRows& TokenDispatcher::dispatch(const float* x, const int32_t* choice) {
  const int64_t k = s_.top_k;
  sorted_rows_ = kernels::moe_dispatch(order_, offsets_, slot_, choice, N_, k, s_.experts);
  kernels::moe_gather(xs_, x, order_, sorted_rows_, k, s_.hidden);
  send();
  return rows_;
}

const float* TokenDispatcher::gather_outputs() {
  receive();
  return ys_;
}

const ExpertGrads& TokenDispatcher::dispatch_grads(const float* dys, float* dxs) {
  dxs_ = dxs;
  send_grads(dys, dxs);
  return grads_;
}

void TokenDispatcher::gather_grads(float* dx) {
  receive_grads(dxs_);
  kernels::moe_gather_backward(dx, dxs_, slot_, N_, s_.top_k, s_.hidden);
}

void LocalDispatcher::Scratch::carve(Carver& c, const ZayaMoeShape& s, int64_t tokens) {
  const int64_t A = tokens * s.top_k;
  dfc1 = c.take<float>(A * 2 * s.expert_ffn);
  dact = c.take<float>(A * s.expert_ffn);
}

LocalDispatcher::LocalDispatcher(const ZayaMoeShape& shape, int64_t tokens, const Scratch* shared)
    : TokenDispatcher(shape, tokens), shared_(shared) {}

void LocalDispatcher::carve_own(Carver& c) {
  const int64_t A = N_ * s_.top_k;
  rows_.experts = s_.experts;
  rows_.offsets = offsets_;
  rows_.x = xs_;
  rows_.y = ys_;
  rows_.fc1 = c.take<float>(A * 2 * s_.expert_ffn);
  rows_.act = c.take<float>(A * s_.expert_ffn);
  grads_.dfc1 = shared_->dfc1;
  grads_.dact = shared_->dact;
}

void LocalDispatcher::send() {
  rows_.bf16 = bf16_scratch_;
}

void LocalDispatcher::send_grads(const float* dys, float* dxs) {
  grads_.dy = dys;
  grads_.dx = dxs;
}

}  // namespace anvil::model
