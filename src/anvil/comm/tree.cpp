// Binomial trees rooted anywhere: ceil(log2 n) steps. Broadcast sends the
// whole message down; reduce combines partial results up.
#include <vector>

#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm::algo {
namespace {

void tree_broadcast(PointToPoint& c, void* data, size_t count, DType t, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  const size_t bytes = count * size_of(t);
  // The step (and tag) of an edge is its level: log2 of the mask joining the pair.
  int mask = 1, level = 0;
  while (mask < n) {
    if (vr & mask) {
      c.recv(data, bytes, (vr - mask + root) % n, "broadcast(tree)", level);
      break;
    }
    mask <<= 1;
    ++level;
  }
  while (mask > 1) {
    mask >>= 1;
    --level;
    if (vr + mask < n) c.send(data, bytes, (vr + mask + root) % n, "broadcast(tree)", level);
  }
}

// `acc` holds this rank's input and is clobbered; at root it ends as the result.
void tree_reduce(PointToPoint& c, void* acc, size_t count, DType t, ReduceOp op, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  const size_t bytes = count * size_of(t);
  std::vector<unsigned char> tmp(bytes + 1);
  for (int mask = 1, step = 0; mask < n; mask <<= 1, ++step) {
    if (vr & mask) {
      c.send(acc, bytes, (vr - mask + root) % n, "reduce(tree)", step);
      return;
    }
    if (vr + mask < n) {
      c.recv(tmp.data(), bytes, (vr + mask + root) % n, "reduce(tree)", step);
      reduce_into(acc, tmp.data(), count, t, op);
    }
  }
}

void broadcast(Context& ctx, const Call& c) {
  tree_broadcast(ctx.p2p(), c.recv, c.count, c.dtype, c.root);
}

void reduce(Context& ctx, const Call& c) {
  tree_reduce(ctx.p2p(), c.recv, c.count, c.dtype, c.op, c.root);
}

constexpr Algorithm kTree[] = {
    {Op::broadcast, Algo::tree, "tree", "ceil(log2 n), binomial", Buffers::in_place, false,
     broadcast},
    {Op::reduce, Algo::tree, "tree", "ceil(log2 n), binomial", Buffers::in_place, false, reduce},
};

}  // namespace

std::span<const Algorithm> tree_algorithms() {
  return kTree;
}

}  // namespace anvil::comm::algo
