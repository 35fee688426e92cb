#include "anvil/comm/registry.hpp"

#include <algorithm>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/comm/families.hpp"

namespace anvil::comm {
namespace {

const std::vector<Algorithm>& registry() {
  static const std::vector<Algorithm> all = [] {
    std::vector<Algorithm> v;
    for (auto family : {algo::mpi_algorithms(), algo::ring_algorithms(), algo::rhd_algorithms(),
                        algo::tree_algorithms(), algo::pairwise_algorithms(),
                        algo::shm_algorithms(), algo::hier_algorithms()}) {
      v.insert(v.end(), family.begin(), family.end());
    }
    return v;
  }();
  return all;
}

// find_algorithm's index: registry()[op][algo], null where none is registered.
struct Index {
  size_t algos = 0;
  std::vector<const Algorithm*> slots;
};

const Index& index() {
  static const Index built = [] {
    Index ix;
    size_t ops = 0;
    for (const Algorithm& a : registry()) {
      ops = std::max(ops, static_cast<size_t>(a.op) + 1);
      ix.algos = std::max(ix.algos, static_cast<size_t>(a.algo) + 1);
    }
    ix.slots.assign(ops * ix.algos, nullptr);
    for (const Algorithm& a : registry()) {
      ix.slots[static_cast<size_t>(a.op) * ix.algos + static_cast<size_t>(a.algo)] = &a;
    }
    return ix;
  }();
  return built;
}

struct OpName {
  Op op;
  const char* name;
};
constexpr OpName kOps[] = {{Op::allreduce, "allreduce"}, {Op::reduce_scatter, "reduce_scatter"},
                           {Op::allgather, "allgather"}, {Op::broadcast, "broadcast"},
                           {Op::reduce, "reduce"},       {Op::alltoall, "alltoall"}};

// "a, b or c"
std::string one_of(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return s;
}

// The registration of `algo` for `op`, or null.
const Algorithm* lookup(Op op, Algo algo) {
  const Index& ix = index();
  const size_t i = static_cast<size_t>(op) * ix.algos + static_cast<size_t>(algo);
  return static_cast<size_t>(algo) < ix.algos && i < ix.slots.size() ? ix.slots[i] : nullptr;
}

}  // namespace

std::span<const Algorithm> registered_algorithms() {
  return registry();
}

const Algorithm& find_algorithm(Op op, Algo algo) {
  if (const Algorithm* a = lookup(op, algo)) return *a;
  throw InputError("--algo: " + to_string(algo) + " does not implement " + to_string(op));
}

bool implements(Op op, Algo algo) {
  return lookup(op, algo) != nullptr;
}

std::vector<Algo> algorithms_for(Op op) {
  std::vector<Algo> out;
  for (const Algorithm& a : registry()) {
    if (a.op == op) out.push_back(a.algo);
  }
  out.push_back(Algo::automatic);
  return out;
}

std::string to_string(Algo a) {
  if (a == Algo::automatic) return "auto";
  for (const Algorithm& r : registry()) {
    if (r.algo == a) return r.name;
  }
  return "?";
}

Algo parse_algo(const std::string& name, const std::string& flag) {
  std::vector<std::string> names;
  for (const Algorithm& r : registry()) {
    if (r.name == name) return r.algo;
    if (std::find(names.begin(), names.end(), r.name) == names.end()) names.push_back(r.name);
  }
  if (name == "auto") return Algo::automatic;
  names.push_back("auto");
  throw InputError(flag + ": expected " + one_of(names) + ", got '" + name + "'");
}

std::string to_string(Op op) {
  for (const OpName& o : kOps) {
    if (o.op == op) return o.name;
  }
  return "?";
}

Op parse_op(const std::string& name, const std::string& flag) {
  std::vector<std::string> names;
  for (const OpName& o : kOps) {
    if (o.name == name) return o.op;
    names.push_back(o.name);
  }
  throw InputError(flag + ": expected " + one_of(names) + ", got '" + name + "'");
}

}  // namespace anvil::comm
