// The token dispatcher of a ZAYA1 MoE layer (Megatron-Core's
// token_dispatcher): between the router and the experts, it sorts the
// layer's N x k assignments by expert (a stable counting sort; the skip
// class is not dispatched), gathers their rows and delivers the rows of the
// experts this process runs; after the experts it brings their outputs back
// into that sorted order, where combine reads them. Backward mirrors it.
// LocalDispatcher runs every expert here; the expert-parallel dispatcher
// (parallel/expert_parallel.hpp) adds an all-to-all to the ranks holding
// the experts. That exchange is all expert parallelism changes: the router,
// the experts and combine are the same.
#pragma once

#include <cstddef>
#include <cstdint>

#include "anvil/kernels/layers.hpp"
#include "anvil/model/carver.hpp"
#include "anvil/model/zaya_experts.hpp"
#include "anvil/model/zaya_moe_shape.hpp"

namespace anvil::model {

class TokenDispatcher {
 public:
  // `tokens`: N, the rows of the layer's input.
  TokenDispatcher(const ZayaMoeShape& shape, int64_t tokens);
  virtual ~TokenDispatcher() = default;
  TokenDispatcher(const TokenDispatcher&) = delete;
  TokenDispatcher& operator=(const TokenDispatcher&) = delete;

  // Takes the sorted order's buffers from `c` (the model's activation
  // arena), then the dispatcher's own (carve_own).
  void carve(Carver& c);
  // bf16 expert GEMMs: the model's conversion scratch, sized for this
  // layer's own assignments (null: fp32).
  void set_bf16_scratch(kernels::Bf16Scratch* scratch) { bf16_scratch_ = scratch; }

  // Forward. choice [N, k] (E = skip), x [N, H].
  const ExpertRows& dispatch(const float* x, const int32_t* choice);
  // After the experts ran on dispatch()'s rows: their outputs as the sorted
  // rows [sorted_rows(), H]; assignment a's is row slots()[a] (-1: skip).
  const float* gather_outputs();
  const float* outputs() const { return ys_; }
  const int32_t* slots() const { return slot_; }
  int64_t sorted_rows() const { return sorted_rows_; }
  const ExpertRows& expert_rows() const { return rows_; }

  // Backward. dys [sorted_rows(), H]: the outputs' gradient in sorted order;
  // dxs [sorted_rows(), H]: where the rows' input gradients come back.
  const ExpertGrads& dispatch_grads(const float* dys, float* dxs);
  // After the experts' backward: adds each token's input gradient to dx [N, H].
  void gather_grads(float* dx);

  // Bytes held outside the model's arena (the expert-parallel exchange
  // buffers, which follow the routing); counted in the model's plan.
  virtual size_t heap_bytes() const { return 0; }
  // Seconds spent communicating since the last call (0 here).
  virtual double take_comm_seconds() { return 0; }

 protected:
  // The exchange between the sorted rows and the experts' rows, which is
  // all a dispatcher defines:
  //   carve_own      its own buffers (the model's activation arena);
  //   send           xs_ (sorted, offsets_ over all E experts) to rows_, the
  //                  rows this process's experts run on, with room for what
  //                  they write;
  //   receive        rows_.y back into ys_, in sorted order;
  //   send_grads     dys (sorted) to grads_ (the experts write grads_.dx);
  //   receive_grads  grads_.dx back into dxs, in sorted order.
  virtual void carve_own(Carver& c) = 0;
  virtual void send() = 0;
  virtual void receive() = 0;
  virtual void send_grads(const float* dys, float* dxs) = 0;
  virtual void receive_grads(float* dxs) = 0;

  ZayaMoeShape s_;
  int64_t N_;
  int32_t *order_ = nullptr, *slot_ = nullptr;  // [N k]
  int64_t* offsets_ = nullptr;                  // [E + 1]
  float *xs_ = nullptr, *ys_ = nullptr;         // [N k, H]: the sorted rows, in and out
  int64_t sorted_rows_ = 0;
  kernels::Bf16Scratch* bf16_scratch_ = nullptr;
  ExpertRows rows_;
  ExpertGrads grads_;
  float* dxs_ = nullptr;
};

// Every expert in this process: the sorted rows are the experts' rows.
class LocalDispatcher : public TokenDispatcher {
 public:
  // The experts' backward scratch, shared by the model's MoE layers (one
  // runs at a time).
  struct Scratch {
    float *dfc1, *dact;
    void carve(Carver& c, const ZayaMoeShape& s, int64_t tokens);
  };
  // `shared` is read at carve().
  LocalDispatcher(const ZayaMoeShape& shape, int64_t tokens, const Scratch* shared);

 protected:
  void carve_own(Carver& c) override;
  void send() override;
  void receive() override {}
  void send_grads(const float* dys, float* dxs) override;
  void receive_grads(float* /*dxs*/) override {}

 private:
  const Scratch* shared_;
};

}  // namespace anvil::model
