// A group of ranks as the algorithms see it (gloo's Context): the MPI
// point-to-point transport over a duplicate of the group's communicator,
// whether every rank shares one node, and what is made on first use, each
// setup collective and under the watchdog: the shared-memory transport, and
// the split into nodes and rails that two-level algorithms run over.
// Algorithms take a Context, never a Communicator.
#pragma once

#include <mpi.h>

#include <memory>

#include "anvil/comm/mpi_transport.hpp"
#include "anvil/comm/shm_transport.hpp"

namespace anvil::comm {

class Context {
 public:
  // Collective over `comm` (duplicates it). ranks_per_node > 0 makes node()
  // blocks of that many consecutive ranks (one machine standing in for
  // several); 0 finds the real nodes.
  Context(MPI_Comm comm, int ranks_per_node);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return mpi_.rank(); }
  int size() const { return mpi_.size(); }
  // True when every rank shares one node (shm works).
  bool single_node() const { return single_node_; }
  double timeout() const { return mpi_.timeout(); }
  // Also the deadline of node() and rail().
  void set_timeout(double seconds);

  MpiTransport& mpi() { return mpi_; }
  const MpiTransport& mpi() const { return mpi_; }
  PointToPoint& p2p() { return mpi_; }
  // InputError when the ranks span more than one node.
  ShmTransport& shm();
  // This rank's node, and its rail: the ranks with the same local index on
  // every node. InputError when nodes hold different numbers of ranks.
  Context& node();
  Context& rail();

 private:
  void split_nodes();

  MpiTransport mpi_;
  int ranks_per_node_ = 0;
  bool single_node_ = true;
  // Destroyed in this order, shm first, before mpi_ frees the communicator.
  std::unique_ptr<Context> rail_, node_;
  std::unique_ptr<ShmTransport> shm_;
};

}  // namespace anvil::comm
