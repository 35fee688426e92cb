// anvil's collective API. One Communicator per MPI communicator: it checks
// the arguments, resolves `auto` through the tuning table, lays the buffers
// out as the chosen algorithm takes them (in-place calls, avg), and
// dispatches to the algorithm registry (registry.hpp). The algorithms run
// over transports (transport.hpp): MPI point-to-point, shared memory.
//
//   mpi       the MPI library's own collective (the baseline)
//   ring      ring reduce-scatter / all-gather (all-reduce = both): 2(n-1)
//             steps, each moving count/n elements per rank — bandwidth-optimal
//   rhd       Rabenseifner: recursive halving reduce-scatter + recursive
//             doubling all-gather, 2 log2(p) steps; non-powers of two fold
//             the first 2r ranks in pairs first (r = n - 2^floor(log2 n))
//   tree      binomial tree broadcast / reduce: ceil(log2 n) steps
//   pairwise  all-to-all(v): n-1 exchange steps with peers rank +/- s
//   shm       shared memory inside a node: chunked and pipelined, every rank
//             reducing its share of each chunk in parallel (shm.cpp)
//   hier      two levels (all-reduce): shm reduce-scatter inside each node,
//             ring all-reduce of each block across nodes among the ranks with
//             the same local index, shm all-gather inside each node. Nodes are
//             found with MPI_COMM_TYPE_SHARED, or simulated with ranks_per_node
//   auto      per (op, ranks, size) from a tuning table (tuning.hpp)
//
// Semantics follow NCCL: reduce-scatter and all-gather split `count`
// elements into blocks with block_count/block_offset (types.hpp); in place
// means recv == send (all-reduce, broadcast, reduce, all-to-all),
// recv == send + block_offset(rank) (reduce-scatter) or
// send == recv + block_offset(rank) (all-gather).
//
// No silent hangs: every wait has a deadline (set_timeout); past it the call
// throws CommTimeout naming the op, the algorithm, the step and the ranks
// that did not arrive. The `mpi` algorithm calls the library's blocking
// collectives (the baseline must stay the library's own code path), which
// cannot be interrupted: a watchdog thread ends the process past the
// deadline with a message naming the op (MPI does not say who is missing).
#pragma once

#include <mpi.h>

#include <cstddef>

#include "anvil/comm/context.hpp"
#include "anvil/comm/registry.hpp"
#include "anvil/comm/tuning.hpp"
#include "anvil/comm/types.hpp"

namespace anvil::comm {

class Communicator {
 public:
  // Duplicates `comm` (anvil's traffic never mixes with the caller's).
  // ranks_per_node > 0 simulates nodes of that many consecutive ranks for
  // `hier` (one machine standing in for several); 0 finds the real nodes.
  // Loads the tuning table ANVIL_COMM_TUNING names, if set.
  explicit Communicator(MPI_Comm comm = MPI_COMM_WORLD, int ranks_per_node = 0);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return context_.rank(); }
  int size() const { return context_.size(); }
  MPI_Comm mpi_comm() const { return context_.mpi().mpi_comm(); }
  void set_timeout(double seconds) { context_.set_timeout(seconds); }
  double timeout() const { return context_.timeout(); }
  // True when every rank of this communicator shares one node (shm works).
  bool single_node() const { return context_.single_node(); }

  void allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, Algo algo);
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op, Algo algo);
  void allgather(const void* send, void* recv, size_t count, DType t, Algo algo);
  void broadcast(void* buf, size_t count, DType t, int root, Algo algo);
  void reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, int root,
              Algo algo);
  // `count` elements to and from every peer.
  void alltoall(const void* send, void* recv, size_t count, DType t, Algo algo);
  // Per-peer counts and offsets, in elements.
  void alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                 void* recv, const size_t* recv_counts, const size_t* recv_offsets, DType t,
                 Algo algo);
  void barrier();

  // The shared-memory transport, set up (collectively) on first use.
  ShmTransport& shm() { return context_.shm(); }
  void set_tuning(TuningTable table) { tuning_ = std::move(table); }
  // The algorithm a call with `algo` runs (resolves auto).
  Algo resolve(Op op, Algo algo, size_t bytes) const;

 private:
  Context context_;
  TuningTable tuning_;
};

}  // namespace anvil::comm
