// The algorithm registry as Communicator, the bench and the CLI see it:
// which algorithms implement each op, in the order the bench measures them;
// names both ways; and the errors that name the flag and list the choices.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "anvil/comm/registry.hpp"
#include "support/input_error.hpp"

namespace anvil::comm {
namespace {

using test_support::expect_input_error;

TEST(AlgorithmRegistry, EachOpListsItsAlgorithmsInRegistryOrderThenAuto) {
  using A = Algo;
  EXPECT_EQ(algorithms_for(Op::allreduce),
            (std::vector<Algo>{A::mpi, A::ring, A::rhd, A::shm, A::hier, A::automatic}));
  EXPECT_EQ(algorithms_for(Op::reduce_scatter),
            (std::vector<Algo>{A::mpi, A::ring, A::shm, A::automatic}));
  EXPECT_EQ(algorithms_for(Op::allgather),
            (std::vector<Algo>{A::mpi, A::ring, A::shm, A::automatic}));
  EXPECT_EQ(algorithms_for(Op::broadcast),
            (std::vector<Algo>{A::mpi, A::tree, A::shm, A::automatic}));
  EXPECT_EQ(algorithms_for(Op::reduce), (std::vector<Algo>{A::mpi, A::tree, A::shm, A::automatic}));
  EXPECT_EQ(algorithms_for(Op::alltoall), (std::vector<Algo>{A::mpi, A::pairwise, A::automatic}));
}

TEST(AlgorithmRegistry, EveryRegistrationIsUniqueNamedAndRunnable) {
  std::set<std::pair<Op, Algo>> seen;
  for (const Algorithm& a : registered_algorithms()) {
    EXPECT_TRUE(seen.insert({a.op, a.algo}).second) << a.name << " twice for " << to_string(a.op);
    EXPECT_EQ(to_string(a.algo), a.name);
    EXPECT_NE(std::string(a.steps), "") << a.name;
    EXPECT_NE(a.run, nullptr) << a.name;
    EXPECT_EQ(&find_algorithm(a.op, a.algo), &a);
  }
}

TEST(AlgorithmRegistry, NamesRoundTripAndUnknownNamesListTheChoices) {
  for (const Algorithm& a : registered_algorithms()) {
    EXPECT_EQ(parse_algo(a.name, "--algo"), a.algo);
    EXPECT_EQ(parse_op(to_string(a.op), "--op"), a.op);
  }
  EXPECT_EQ(to_string(Algo::automatic), "auto");
  EXPECT_EQ(parse_algo("auto", "--algo"), Algo::automatic);
  expect_input_error([] { parse_algo("magic", "--algo"); },
                     {"--algo: expected mpi, ring, rhd, tree, pairwise, shm, hier or auto, got "
                      "'magic'"});
  expect_input_error([] { parse_op("allsum", "--op"); },
                     {"--op: expected allreduce, reduce_scatter, allgather, broadcast, reduce or "
                      "alltoall, got 'allsum'"});
}

TEST(AlgorithmRegistry, AnAlgorithmOutsideItsOpsIsAnInputErrorNamingBoth) {
  expect_input_error([] { find_algorithm(Op::allreduce, Algo::tree); },
                     {"--algo: tree does not implement allreduce"});
  expect_input_error([] { find_algorithm(Op::alltoall, Algo::automatic); },
                     {"--algo: auto does not implement alltoall"});
}

}  // namespace
}  // namespace anvil::comm
