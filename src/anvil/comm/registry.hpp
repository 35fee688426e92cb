// The registry of collective algorithms: every family's registrations
// (families.hpp) in one list, looked up by (op, algo) for Communicator's
// dispatch, and listed per op for the bench and the tests. Algorithm names
// are the registered ones.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "anvil/comm/algorithm.hpp"

namespace anvil::comm {

// Algorithm names are the registered ones, and "auto".
std::string to_string(Algo a);
std::string to_string(Op op);
// Throw InputError naming `flag` for unknown names.
Algo parse_algo(const std::string& name, const std::string& flag);
Op parse_op(const std::string& name, const std::string& flag);
// The algorithms registered for an op, in registry order, then auto.
std::vector<Algo> algorithms_for(Op op);

// Every registered algorithm, family by family in the order of Algo.
std::span<const Algorithm> registered_algorithms();
// The registration of `algo` for `op`; InputError when it does not implement it.
const Algorithm& find_algorithm(Op op, Algo algo);
// True when `algo` is registered for `op`.
bool implements(Op op, Algo algo);

}  // namespace anvil::comm
