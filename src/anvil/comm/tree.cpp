// Binomial trees rooted anywhere: ceil(log2 n) steps. Broadcast sends the
// whole message down; reduce combines partial results up.
#include <vector>

#include "anvil/comm/algorithms.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm::algo {

void tree_broadcast(Communicator& c, void* data, size_t count, DType t, int root) {
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

void tree_reduce(Communicator& c, void* acc, size_t count, DType t, ReduceOp op, int root) {
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

}  // namespace anvil::comm::algo
