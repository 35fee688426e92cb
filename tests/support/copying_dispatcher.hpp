// A token dispatcher that moves the experts' rows through buffers of its own
// in both directions, as the expert-parallel one does on a group of one
// rank. Whatever a MoE layer or a model computes with it must equal, bit for
// bit, what it computes with LocalDispatcher: the dispatcher decides where
// rows live, never what is computed. `heap` is what it reports holding
// outside the arena.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "anvil/model/zaya_dispatcher.hpp"

namespace test_support {

class CopyingDispatcher : public anvil::model::TokenDispatcher {
 public:
  CopyingDispatcher(const anvil::model::ZayaMoeShape& shape, int64_t tokens, size_t heap = 0)
      : TokenDispatcher(shape, tokens), heap_(heap) {}
  size_t heap_bytes() const override { return heap_; }

 protected:
  void carve_own(anvil::model::Carver& c) override {
    const int64_t A = N_ * s_.top_k, H = s_.hidden, F = s_.expert_ffn;
    for (float** v : {&xr_, &yr_, &dyr_, &dxr_}) *v = c.take<float>(A * H);
    for (float** v : {&fc1_, &dfc1_}) *v = c.take<float>(A * 2 * F);
    for (float** v : {&act_, &dact_}) *v = c.take<float>(A * F);
  }
  void send() override {
    std::copy(xs_, xs_ + sorted_rows_ * s_.hidden, xr_);
    rows_ = {s_.experts, offsets_, xr_, yr_, fc1_, act_, bf16_scratch_};
  }
  void receive() override { std::copy(yr_, yr_ + sorted_rows_ * s_.hidden, ys_); }
  void send_grads(const float* dys, float* /*dxs*/) override {
    std::copy(dys, dys + sorted_rows_ * s_.hidden, dyr_);
    std::fill(dxr_, dxr_ + sorted_rows_ * s_.hidden, 0.0f);
    grads_ = {dyr_, dxr_, dfc1_, dact_};
  }
  void receive_grads(float* dxs) override { std::copy(dxr_, dxr_ + sorted_rows_ * s_.hidden, dxs); }

 private:
  size_t heap_;
  float *xr_ = nullptr, *yr_ = nullptr, *fc1_ = nullptr, *act_ = nullptr, *dyr_ = nullptr,
        *dxr_ = nullptr, *dfc1_ = nullptr, *dact_ = nullptr;
};

}  // namespace test_support
