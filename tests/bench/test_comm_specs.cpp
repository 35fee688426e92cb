// The collective specs of `anvil bench comm` against every registered
// algorithm, on whatever rank count mpirun gives (part of comm_tests, 1..8
// ranks): every op's exact check passes in place and out of place, with a
// root other than 0, and each op measures the algorithms the registry holds
// for it, mpi first, in the order `--op all` lists the specs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "anvil/bench/comm_bench.hpp"
#include "anvil/bench/comm_specs.hpp"

namespace anvil::bench {
namespace {

TEST(CommBenchSpecs, EveryCollectiveChecksExactlyWithEveryAlgorithm) {
  comm::Communicator c(MPI_COMM_WORLD);
  for (bool in_place : {false, true}) {
    CommBenchOptions o;
    o.ops = {"all"};
    o.dtype = "bf16";
    o.min_bytes = 8;
    o.max_bytes = 4096;
    o.factor = 8;
    o.iters = 1;
    o.warmup = 0;
    o.in_place = in_place;
    o.root = c.size() - 1;
    o.timeout_s = 120;
    const CommBenchResult r = run_comm_bench(c, o);
    // Per op, in measured order: "op: algo algo ..." at its first size.
    std::vector<std::string> measured, expected;
    std::string op;
    int64_t first_bytes = -1;
    for (const CommPoint& p : r.points) {
      EXPECT_EQ(p.wrong, 0) << p.op << "(" << p.algo << ") " << p.bytes << " bytes"
                            << (in_place ? " in place" : "") << " on " << c.size() << " ranks";
      if (p.op != op) {
        op = p.op;
        first_bytes = p.bytes;
        measured.push_back(op + ":");
      }
      if (p.bytes == first_bytes) measured.back() += " " + p.algo;
    }
    for (const CollectiveSpec& spec : collective_specs()) {
      expected.push_back(comm::to_string(spec.op) + ": mpi");
      for (comm::Algo a : comm::algorithms_for(spec.op)) {
        if (a != comm::Algo::mpi) expected.back() += " " + comm::to_string(a);
      }
    }
    EXPECT_EQ(measured, expected);
  }
}

}  // namespace
}  // namespace anvil::bench
