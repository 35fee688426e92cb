// The context group of a training run (model/context_parallel.hpp's
// ContextGroup over MPI): C consecutive ranks of the job split each
// sequence. The K/V all-gather and the dK/dV reduce-scatter run on anvil's
// collectives (comm/, `auto` algorithm); the halos are point-to-point
// messages on a communicator of their own, waited on with the group's
// deadline (a rank that stops answering is named, not waited for forever).
#pragma once

#include <mpi.h>

#include <span>

#include "anvil/comm/communicator.hpp"
#include "anvil/model/context_parallel.hpp"

namespace anvil::parallel {

class MpiContextGroup final : public model::ContextGroup {
 public:
  // `comm`: the C ranks of this rank's group (DataParallelGroup::context_group).
  explicit MpiContextGroup(comm::Communicator& comm);
  ~MpiContextGroup() override;
  MpiContextGroup(const MpiContextGroup&) = delete;
  MpiContextGroup& operator=(const MpiContextGroup&) = delete;
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void allgather(const float* send, float* recv, size_t count) override;
  void reduce_scatter(const float* send, float* recv, size_t count) override;
  void exchange(std::span<const Message> sends, std::span<const Message> recvs) override;

 private:
  comm::Communicator& comm_;
  MPI_Comm p2p_ = MPI_COMM_NULL;
};

}  // namespace anvil::parallel
