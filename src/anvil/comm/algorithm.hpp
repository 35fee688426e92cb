// What an algorithm is to the registry: the op it implements, its name and
// step count, how it takes its buffers, and the function that runs one
// call over a Context. Each family file (families.hpp) registers one per op.
#pragma once

#include <cstddef>

#include "anvil/comm/types.hpp"

namespace anvil::comm {

enum class Algo { mpi, ring, rhd, tree, pairwise, shm, hier, automatic };
enum class Op { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall };

class Context;

// One collective call as Communicator hands it to an algorithm, the buffers
// already laid out as the algorithm's Buffers asks.
struct Call {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements, as the op's Communicator call counts them
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;  // broadcast, reduce
  // all-to-all(v): per-peer counts and offsets in elements; send and recv never overlap.
  const size_t* send_counts = nullptr;
  const size_t* send_offsets = nullptr;
  const size_t* recv_counts = nullptr;
  const size_t* recv_offsets = nullptr;
};

// How an algorithm takes its buffers.
enum class Buffers {
  // The caller's send and recv as given; the algorithm honours the in-place
  // layouts (communicator.hpp) itself.
  caller,
  // One buffer of the whole message (send == recv) that holds this rank's
  // input and that the algorithm may overwrite; Communicator copies the
  // input in and the result out (all-gather: this rank's block is in place).
  in_place,
};

struct Algorithm {
  Op op;
  Algo algo;
  const char* name;
  // Its step count (n ranks; p = 2^floor(log2 n)), as docs/comm.md tabulates it.
  const char* steps;
  Buffers buffers;
  // True: it divides by the rank count for ReduceOp::avg itself; false: it
  // reduces avg as sum and Communicator divides the result.
  bool averages;
  void (*run)(Context& context, const Call& call);
};

}  // namespace anvil::comm
