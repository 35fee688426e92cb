// Ring reduce-scatter and all-gather (Patarasuk & Yuan; gloo's ring): n-1
// steps each, every rank sending one block of count/n elements per step to
// rank+1 and receiving one from rank-1. Bandwidth-optimal: each rank sends
// 2(n-1)/n of the message for an all-reduce.
#include <vector>

#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm::algo {
namespace {

// In place over `data`: afterwards block `rank` of data is reduced. `what`
// names the op in timeout errors.
void reduce_scatter_in_place(PointToPoint& c, void* data, size_t count, DType t, ReduceOp op,
                             const char* what) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const size_t es = size_of(t);
  auto* d = static_cast<unsigned char*>(data);
  std::vector<unsigned char> tmp(block_count(count, n, 0) * es + 1);
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    // After step s, block (r - s - 2) holds s + 2 contributions; block r ends complete.
    const int sb = ((r - s - 1) % n + n) % n;
    const int rb = ((r - s - 2) % n + n) % n;
    c.sendrecv(d + block_offset(count, n, sb) * es, block_count(count, n, sb) * es, next,
               tmp.data(), block_count(count, n, rb) * es, prev, what, s);
    reduce_into(d + block_offset(count, n, rb) * es, tmp.data(), block_count(count, n, rb), t, op);
  }
}

// In place over `data` (block `rank` filled): afterwards all blocks are filled.
void allgather_in_place(PointToPoint& c, void* data, size_t count, DType t, const char* what) {
  const int n = c.size(), r = c.rank();
  const size_t es = size_of(t);
  auto* d = static_cast<unsigned char*>(data);
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int sb = ((r - s) % n + n) % n;
    const int rb = ((r - s - 1) % n + n) % n;
    c.sendrecv(d + block_offset(count, n, sb) * es, block_count(count, n, sb) * es, next,
               d + block_offset(count, n, rb) * es, block_count(count, n, rb) * es, prev, what, s);
  }
}

void reduce_scatter(Context& ctx, const Call& c) {
  reduce_scatter_in_place(ctx.p2p(), c.recv, c.count, c.dtype, c.op, "reduce_scatter(ring)");
}

void allgather(Context& ctx, const Call& c) {
  allgather_in_place(ctx.p2p(), c.recv, c.count, c.dtype, "allgather(ring)");
}

void allreduce(Context& ctx, const Call& c) {
  ring_allreduce(ctx.p2p(), c.recv, c.count, c.dtype, c.op);
}

constexpr Algorithm kRing[] = {
    {Op::allreduce, Algo::ring, "ring", "2(n-1), count/n elements each", Buffers::in_place, false,
     allreduce},
    {Op::reduce_scatter, Algo::ring, "ring", "n-1, count/n elements each", Buffers::in_place, false,
     reduce_scatter},
    {Op::allgather, Algo::ring, "ring", "n-1, count/n elements each", Buffers::in_place, false,
     allgather},
};

}  // namespace

void ring_allreduce(PointToPoint& p2p, void* data, size_t count, DType t, ReduceOp op) {
  reduce_scatter_in_place(p2p, data, count, t, op, "allreduce(ring)");
  allgather_in_place(p2p, data, count, t, "allreduce(ring)");
}

std::span<const Algorithm> ring_algorithms() {
  return kRing;
}

}  // namespace anvil::comm::algo
