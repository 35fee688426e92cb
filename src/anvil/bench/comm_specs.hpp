// One spec per collective for `anvil bench comm`, in the manner of
// nccl-tests' testColl: how a message size becomes a count, the bus-bandwidth
// factor, which table columns apply, the exact check pattern and its
// expected result, and how to call the collective through Communicator. The
// MPI library's own collective is the registered algorithm "mpi", so the
// same `run` times the baseline. comm_bench.cpp's sweep, timing, checking and
// printing work from these alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "anvil/comm/communicator.hpp"

namespace anvil::bench {

// One (collective, size) as the bench runs it: this rank's buffers (whole
// messages) and the call's arguments.
struct CommCase {
  comm::Communicator& comm;
  unsigned char* send;
  unsigned char* recv;
  size_t count;  // elements (per peer where the spec is per_peer)
  comm::DType dtype;
  comm::ReduceOp redop;
  int root;
  bool in_place;
};

struct CollectiveSpec {
  comm::Op op;
  // `count` is per peer: messages hold count x ranks elements (all-to-all).
  bool per_peer = false;
  // The tables show the reduce op ("none" otherwise) and the root (-1 otherwise).
  bool reduces = false;
  bool rooted = false;
  // busbw = algbw x this, for n ranks (nccl-tests' PERFORMANCE.md).
  double (*bus_factor)(int n) = nullptr;
  // Puts the exact check pattern (comm/check.hpp) in this rank's inputs.
  void (*fill)(const CommCase& c) = nullptr;
  // Runs the collective once with algorithm `a`.
  void (*run)(const CommCase& c, comm::Algo a) = nullptr;
  // This rank's result elements that differ from the closed form, after fill and run.
  int64_t (*wrong)(const CommCase& c) = nullptr;
};

// Every collective, in the order `--op all` measures them.
std::span<const CollectiveSpec> collective_specs();
const CollectiveSpec& spec_for(comm::Op op);

}  // namespace anvil::bench
