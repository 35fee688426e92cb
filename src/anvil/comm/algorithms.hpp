// The point-to-point algorithms behind Communicator (see communicator.hpp
// for each one's step count). They take non-aliased buffers; Communicator
// handles in-place calls and avg. Internal to comm/.
#pragma once

#include <cstddef>

#include "anvil/comm/communicator.hpp"

namespace anvil::comm::algo {

// In place over `data` (count elements): afterwards every rank holds the reduction.
void ring_allreduce(Communicator& c, void* data, size_t count, DType t, ReduceOp op);
// In place over `data`: afterwards block `rank` of data is reduced.
// `what` names the op in timeout errors.
void ring_reduce_scatter_inplace(Communicator& c, void* data, size_t count, DType t, ReduceOp op,
                                 const char* what);
// In place over `data` (block `rank` filled): afterwards all blocks are filled.
void ring_allgather_inplace(Communicator& c, void* data, size_t count, DType t, const char* what);

void rhd_allreduce(Communicator& c, void* data, size_t count, DType t, ReduceOp op);

void tree_broadcast(Communicator& c, void* data, size_t count, DType t, int root);
// `acc` holds this rank's input and is clobbered; at root it ends as the result.
void tree_reduce(Communicator& c, void* acc, size_t count, DType t, ReduceOp op, int root);

void pairwise_alltoallv(Communicator& c, const void* send, const size_t* send_counts,
                        const size_t* send_offsets, void* recv, const size_t* recv_counts,
                        const size_t* recv_offsets, DType t);

}  // namespace anvil::comm::algo
