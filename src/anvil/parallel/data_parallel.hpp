// The data-parallel group of a training run: every MPI rank of the job holds
// the whole model and trains on its rows of each global batch (see
// data/batches.hpp). The group owns the communicators: one for the small
// per-step collectives (loss, token counts, router loads, the stop flag,
// per-rank metrics) and an AsyncCommunicator whose progress thread reduces
// the gradient buckets while backward runs (grad_reducer.hpp).
// MPI must be initialised with MPI_THREAD_MULTIPLE.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "anvil/comm/async.hpp"
#include "anvil/comm/communicator.hpp"

namespace anvil::parallel {

class DataParallelGroup {
 public:
  // Collective over MPI_COMM_WORLD. ranks_per_node > 0 simulates nodes of
  // that many consecutive ranks (the hierarchical all-reduce then reduces
  // across them as across hosts); 0 finds the real nodes.
  explicit DataParallelGroup(int ranks_per_node = 0);
  ~DataParallelGroup();

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  // Ranks of this group on this machine (the real one, not simulated).
  int local_size() const { return local_size_; }
  comm::Communicator& comm() { return *comm_; }
  comm::AsyncCommunicator& async() { return *async_; }

  // Element-wise sums over the group, in place (a fixed reduction order).
  void sum(std::span<double> values);
  void sum(std::span<int64_t> values);
  // Every rank's value, by rank.
  std::vector<double> gather(double value);
  // The expert-parallel group of this rank: `ep` consecutive ranks
  // (collective; made once; ep must divide the group's size).
  comm::Communicator& expert_group(int ep);
  // The expert-data-parallel group: the ranks holding the same experts
  // (rank % ep alike; ordered by rank, so rank r is r / ep there), which
  // reduce those experts' gradients and share their optimizer work. Made by
  // expert_group; a blocking communicator and a progress thread's.
  comm::Communicator& expert_data_group();
  // The context-parallel group of this rank: `cp` consecutive ranks, which
  // split each sequence (collective; made once per cp, kept for the group's
  // life: a recipe's phases may each take another; cp must divide the size).
  comm::Communicator& context_group(int cp);
  comm::AsyncCommunicator& expert_data_async();

 private:
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<comm::AsyncCommunicator> async_;
  std::unique_ptr<comm::Communicator> expert_, expert_data_;
  std::unique_ptr<comm::AsyncCommunicator> expert_data_async_;
  struct Context {
    MPI_Comm mpi = MPI_COMM_NULL;
    std::unique_ptr<comm::Communicator> comm;
  };
  std::map<int, Context> contexts_;  // by cp
  MPI_Comm expert_mpi_ = MPI_COMM_NULL, expert_data_mpi_ = MPI_COMM_NULL;
  int local_size_ = 1;
};

}  // namespace anvil::parallel
