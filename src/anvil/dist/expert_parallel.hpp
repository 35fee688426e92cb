// Expert parallelism for ZAYA1's MoE layers (--ep K): the K ranks of an
// expert-parallel group each hold E/K of the experts — rank r experts
// [r E/K, (r + 1) E/K). After routing, every rank sends each expert's rows
// to the rank holding it (all-to-all(v): the rows are already sorted by
// expert, so each destination's rows are one contiguous run), the owner runs
// its experts on the rows of all K ranks (grouped by expert, then by source
// rank), and the outputs go back the same way; backward mirrors it with the
// output gradients. The router, the combine and the balancing (whose loads
// the trainer sums over every rank) are untouched, so choices and biases are
// the ones without EP.
//
// Weights and gradients stay in the full arenas: a rank writes gradients only
// for its own experts (zeros for the others), so the data-parallel gradient
// reduction over all ranks sums each expert's gradient over its owners in
// every group — the expert-data-parallel reduction.
#pragma once

#include <cstdint>
#include <vector>

#include "anvil/comm/communicator.hpp"
#include "anvil/model/zaya_moe_layer.hpp"

namespace anvil::dist {

class AllToAllExperts : public model::ExpertDispatcher {
 public:
  // `group`: the K ranks sharing the experts; E must be a multiple of K.
  AllToAllExperts(comm::Communicator& group, const model::ZayaMoeShape& shape);
  void forward(float* ys, const float* xs, const int64_t* offsets,
               const model::ZayaMoeParams& p) override;
  void backward(float* dxs, const model::ZayaMoeParams& g, const float* dys,
                const model::ZayaMoeParams& p, std::vector<float>& dy,
                std::vector<float>& dact) override;
  size_t bytes() const override;
  double take_comm_seconds() override;

 private:
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

  comm::Communicator& group_;
  model::ZayaMoeShape s_;
  int K_, rank_;
  int64_t per_;                  // experts per rank
  std::vector<int64_t> counts_;  // [K][E]: rows rank k routed to expert e this step
  std::vector<size_t> send_counts_, send_offsets_, recv_counts_, recv_offsets_;  // floats
  std::vector<int64_t> seg_;  // [per + 1]: local expert j's rows in the grouped buffers
  std::vector<float> recv_, xr_, y_, act_, yr_, dyr_, dxr_;
  double comm_seconds_ = 0;
};

}  // namespace anvil::dist
