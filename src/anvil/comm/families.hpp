// The algorithm families behind the registry, one file each (mpi.cpp,
// ring.cpp, rhd.cpp, tree.cpp, pairwise.cpp, shm.cpp, hier.cpp), and the
// kernels one family reuses from another (hier runs shm inside a node and
// ring across nodes). Kernels take non-aliased buffers, or work in place
// where they say so; Communicator handles the caller's layouts and avg.
// Internal to comm/.
#pragma once

#include <cstddef>
#include <span>

#include "anvil/comm/algorithm.hpp"
#include "anvil/comm/shm_transport.hpp"
#include "anvil/comm/transport.hpp"

namespace anvil::comm::algo {

std::span<const Algorithm> mpi_algorithms();
std::span<const Algorithm> ring_algorithms();
std::span<const Algorithm> rhd_algorithms();
std::span<const Algorithm> tree_algorithms();
std::span<const Algorithm> pairwise_algorithms();
std::span<const Algorithm> shm_algorithms();
std::span<const Algorithm> hier_algorithms();

// In place over `data` (count elements): afterwards every rank holds the reduction.
void ring_allreduce(PointToPoint& p2p, void* data, size_t count, DType t, ReduceOp op);

// This rank's block of `count` elements, reduced over the node into `recv`.
void shm_reduce_scatter(ShmTransport& shm, const void* send, void* recv, size_t count, DType t,
                        ReduceOp op);
// Every rank's block of `count` elements gathered into `recv`.
void shm_allgather(ShmTransport& shm, const void* send, void* recv, size_t count, DType t);

}  // namespace anvil::comm::algo
