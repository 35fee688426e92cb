// Two-level all-reduce for nodes joined by a network, each rank sending
// only 1/L of the message across nodes (L ranks per node), as on a
// rails-only network: a shared-memory reduce-scatter inside each node, a
// ring all-reduce of each block along its rail (the ranks with the same
// local index on every node), and a shared-memory all-gather inside each
// node. Nodes are Context::node(), real or simulated.
#include <cstring>
#include <vector>

#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm::algo {
namespace {

// In place over c.recv; divides for avg itself, once, on the reduced blocks.
void allreduce(Context& ctx, const Call& c) {
  Context& node = ctx.node();
  Context& rail = ctx.rail();
  void* data = c.recv;
  const size_t count = c.count;
  const DType t = c.dtype;
  // Inside the node: each local rank ends with its block reduced over the node.
  const int local = node.rank(), local_size = node.size();
  const size_t es = size_of(t);
  const ReduceOp inner = c.op == ReduceOp::avg ? ReduceOp::sum : c.op;
  unsigned char* block =
      static_cast<unsigned char*>(data) + block_offset(count, local_size, local) * es;
  const size_t mine = block_count(count, local_size, local);
  std::vector<unsigned char> staged(mine * es + 1);
  shm_reduce_scatter(node.shm(), data, staged.data(), count, t, inner);
  // Across nodes: the ranks holding the same block reduce it among themselves.
  ring_allreduce(rail.p2p(), staged.data(), mine, t, inner);
  if (c.op == ReduceOp::avg) divide_by(staged.data(), mine, t, ctx.size());
  if (mine) std::memcpy(block, staged.data(), mine * es);
  shm_allgather(node.shm(), block, data, count, t);
}

constexpr Algorithm kHier[] = {
    {Op::allreduce, Algo::hier, "hier", "shm reduce-scatter, ring along the rail, shm all-gather",
     Buffers::in_place, true, allreduce},
};

}  // namespace

std::span<const Algorithm> hier_algorithms() {
  return kHier;
}

}  // namespace anvil::comm::algo
