#include "anvil/comm/context.hpp"

#include <string>

#include "anvil/base/error.hpp"

namespace anvil::comm {

Context::Context(MPI_Comm comm, int ranks_per_node) : mpi_(comm), ranks_per_node_(ranks_per_node) {
  MPI_Comm node;
  MPI_Comm_split_type(mpi_.mpi_comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int local = node_size == size(), all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, mpi_.mpi_comm());
  single_node_ = all != 0;
}

Context::~Context() = default;

void Context::set_timeout(double seconds) {
  mpi_.set_timeout(seconds);
  if (node_) node_->set_timeout(seconds);
  if (rail_) rail_->set_timeout(seconds);
}

ShmTransport& Context::shm() {
  if (!single_node_) {
    throw InputError("--algo shm: the ranks of this communicator span more than one node");
  }
  if (!shm_)
    mpi_.blocking("shm segment setup", [&] { shm_ = std::make_unique<ShmTransport>(mpi_); });
  return *shm_;
}

Context& Context::node() {
  if (!node_) mpi_.blocking("hier setup", [&] { split_nodes(); });
  return *node_;
}

Context& Context::rail() {
  if (!rail_) mpi_.blocking("hier setup", [&] { split_nodes(); });
  return *rail_;
}

void Context::split_nodes() {
  const int me = rank(), n = size();
  int color = 0;
  if (ranks_per_node_ > 0) {
    if (n % ranks_per_node_ != 0) {
      throw InputError("--ranks-per-node: " + std::to_string(ranks_per_node_) +
                       " does not divide the " + std::to_string(n) + " ranks");
    }
    color = me / ranks_per_node_;
  } else {
    // Real nodes: number them by their lowest rank.
    MPI_Comm shared;
    MPI_Comm_split_type(mpi_.mpi_comm(), MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &shared);
    MPI_Allreduce(&me, &color, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
  }
  MPI_Comm node, rail;
  MPI_Comm_split(mpi_.mpi_comm(), color, me, &node);
  int local = 0, local_size = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  int min_size = 0, max_size = 0;
  MPI_Allreduce(&local_size, &min_size, 1, MPI_INT, MPI_MIN, mpi_.mpi_comm());
  MPI_Allreduce(&local_size, &max_size, 1, MPI_INT, MPI_MAX, mpi_.mpi_comm());
  if (min_size != max_size) {
    MPI_Comm_free(&node);
    throw InputError("--algo hier: nodes hold different numbers of ranks (" +
                     std::to_string(min_size) + " to " + std::to_string(max_size) + ")");
  }
  MPI_Comm_split(mpi_.mpi_comm(), local, me, &rail);
  node_ = std::make_unique<Context>(node, 0);
  rail_ = std::make_unique<Context>(rail, 0);
  node_->set_timeout(timeout());
  rail_->set_timeout(timeout());
  MPI_Comm_free(&node);
  MPI_Comm_free(&rail);
}

}  // namespace anvil::comm
