// Expert parallelism for ZAYA1's MoE layers (--ep K): the K ranks of an
// expert-parallel group each hold E/K of the experts — rank r experts
// [r E/K, (r + 1) E/K). AllToAllDispatcher is the MoE layer's token
// dispatcher under EP (model/zaya_dispatcher.hpp): after the local sort by
// expert, every rank sends each expert's rows to the rank holding it
// (all-to-all(v): the rows are already sorted by expert, so each
// destination's rows are one contiguous run); the owner's experts run on the
// rows of all K ranks (grouped by expert, then by source rank), and the
// outputs go back the same way; backward mirrors it with the output
// gradients. The router, the experts, combine and the balancing (whose
// loads the trainer sums over every rank) are the ones without EP, so
// choices and biases are too.
//
// A rank holds the weights, gradients and optimizer state of its own experts
// only (model::ExpertRange: its registry names just those, under their
// global names); their gradients are summed over the ranks holding the same
// experts, one per group (DataParallelGroup::expert_data_group, through
// GradReducer's ReduceRange), everything else over all ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/comm/communicator.hpp"
#include "anvil/model/zaya_dispatcher.hpp"

namespace anvil::parallel {

class AllToAllDispatcher : public model::TokenDispatcher {
 public:
  // The exchange buffers and the experts' backward scratch, used only while
  // one layer's experts run: one set shared by all the MoE layers (the rows
  // kept for backward are per layer).
  struct Scratch {
    std::vector<float> recv, in, out;  // what arrives; dy for backward; y or dx
    std::vector<float> dfc1, dact;     // the experts' backward scratch
    size_t bytes() const;
  };

  // `group`: the K ranks sharing the experts; E must be a multiple of K.
  // `tokens`: the layer's N. The buffers are made for N x k received rows
  // per step (what a rank receives when the load is balanced) and grow when
  // the routing sends it more: they live outside the model's arena.
  // `scratch`: another layer's (scratch()), or null for a set of its own,
  // which its heap_bytes() then counts.
  AllToAllDispatcher(comm::Communicator& group, const model::ZayaMoeShape& shape, int64_t tokens,
                     std::shared_ptr<Scratch> scratch = nullptr);
  size_t heap_bytes() const override;
  double take_comm_seconds() override;
  const std::shared_ptr<Scratch>& scratch() const { return scratch_; }

 protected:
  void carve_own(model::Carver& /*c*/) override {}
  void send() override;
  void receive() override;
  void send_grads(const float* dys, float* dxs) override;
  void receive_grads(float* dxs) override;

 private:
  // Everyone's rows per expert, and from them the exchange's layout.
  void plan_exchange();
  // Sends `in` (local sorted order) to the owners and groups what arrives by
  // local expert into `out`.
  void to_owners(const float* in, std::vector<float>& out);
  // Ungroups `in` (grouped by local expert) and sends it back into `out`
  // (local sorted order).
  void from_owners(const float* in, float* out);
  // copy(grouped, received, bytes) for each (local expert, source rank)
  // block: its offsets (floats) in the grouped and the received buffers.
  template <typename Copy>
  void each_block(Copy copy) const;
  // The bf16 conversion scratch for `rows` received rows (null in fp32).
  kernels::Bf16Scratch* bf16_scratch(int64_t rows);

  comm::Communicator& group_;
  int K_, rank_;
  int64_t per_;                  // experts per rank
  std::vector<int64_t> counts_;  // [K][E]: rows rank k routed to expert e this step
  std::vector<size_t> send_counts_, send_offsets_, recv_counts_, recv_offsets_;  // floats
  std::vector<int64_t> seg_;         // [per + 1]: local expert j's rows in the grouped buffers
  std::vector<float> xr_, y_, act_;  // the rows received, and SwiGLU's: kept for backward
  std::vector<bf16> low_a_, low_b_;  // bf16 mode: grown to the rows received
  kernels::Bf16Scratch low_scratch_own_;
  bool owns_scratch_;  // counted in heap_bytes()
  std::shared_ptr<Scratch> scratch_;
  double comm_seconds_ = 0;
};

}  // namespace anvil::parallel
