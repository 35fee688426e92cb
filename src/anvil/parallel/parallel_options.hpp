// Data, expert and context parallelism's options for a training run under mpirun
// (base/options.hpp).
#pragma once

#include "anvil/base/options.hpp"

namespace anvil::parallel {

struct ParallelOptions {
  double bucket_mib = 4.0;
  bool zero = false;
  int ep = 1;
  int cp = 1;
  int ranks_per_node = 0;
  template <class V>
  void describe(V& v) {
    v({.name = "bucket_mib",
       .help = "Data parallel: gradient bucket size in MiB; each bucket's all-reduce starts as "
               "soon as backward has written it"},
      bucket_mib, [](const double& x) { return x > 0 ? "" : std::string("must be > 0"); });
    v({.name = "zero",
       .help = "ZeRO-1: each rank keeps the AdamW state of 1/N of the parameters, updates "
               "those and all-gathers the weights (Muon matrices: each owned whole by one rank)"},
      zero);
    v({.name = "ep",
       .help = "Expert parallelism (MoE models, under mpirun): groups of N consecutive ranks "
               "share the experts, E/N each, tokens dispatched by all-to-all"},
      ep, at_least(1));
    v({.name = "cp",
       .help = "Context parallelism (under mpirun): groups of N consecutive ranks split each "
               "sequence into 2N chunks, rank r holding chunks r and 2N-1-r; attention "
               "all-gathers K/V over the group, CCA exchanges halo rows; the ranks / N groups "
               "are data-parallel replicas (train.seq: a multiple of 2N)"},
      cp, at_least(1));
    v({.name = "ranks_per_node",
       .help = "Simulate nodes of N consecutive ranks (the gradient all-reduce then crosses "
               "them as it would cross hosts); 0: the real nodes"},
      ranks_per_node, at_least(0));
  }
};

}  // namespace anvil::parallel
