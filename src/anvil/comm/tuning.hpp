// What `auto` runs: per (op, rank count, message size) the algorithm a
// tuning table names (`anvil bench comm --tuning-out` writes one, a process
// loads it from ANVIL_COMM_TUNING), else a built-in rule. The JSON format is
// in docs/comm.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "anvil/comm/registry.hpp"

namespace anvil::comm {

// For an op and rank count, the first row whose max_bytes covers the message.
struct TuningRow {
  Op op;
  int ranks = 1;
  int64_t max_bytes = 0;
  Algo algo = Algo::mpi;
};

class TuningTable {
 public:
  std::vector<TuningRow> rows;
  // The row's algorithm, or the built-in rule when no row covers the call:
  // shm on one node, hier across nodes, mpi for the ops they do not
  // implement (one node: all-to-all; across nodes: all but all-reduce).
  Algo pick(Op op, int ranks, size_t bytes, bool single_node) const;
  static TuningTable load(const std::string& path);  // throws InputError naming the path
  void save(const std::string& path) const;          // atomic
};

}  // namespace anvil::comm
