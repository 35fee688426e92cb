// Pairwise all-to-all(v): n-1 steps; at step s each rank sends to rank+s and
// receives from rank-s, so every pair exchanges exactly once and no rank
// is a hot spot.
#include <cstring>

#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"

namespace anvil::comm::algo {
namespace {

void pairwise_alltoallv(PointToPoint& c, const void* send, const size_t* send_counts,
                        const size_t* send_offsets, void* recv, const size_t* recv_counts,
                        const size_t* recv_offsets, DType t) {
  const int n = c.size(), r = c.rank();
  const size_t es = size_of(t);
  const auto* s = static_cast<const unsigned char*>(send);
  auto* d = static_cast<unsigned char*>(recv);
  if (send_counts[r])
    std::memcpy(d + recv_offsets[r] * es, s + send_offsets[r] * es, send_counts[r] * es);
  for (int step = 1; step < n; ++step) {
    const int dst = (r + step) % n, src = (r - step + n) % n;
    c.sendrecv(s + send_offsets[dst] * es, send_counts[dst] * es, dst, d + recv_offsets[src] * es,
               recv_counts[src] * es, src, "alltoall(pairwise)", step);
  }
}

void alltoallv(Context& ctx, const Call& c) {
  pairwise_alltoallv(ctx.p2p(), c.send, c.send_counts, c.send_offsets, c.recv, c.recv_counts,
                     c.recv_offsets, c.dtype);
}

constexpr Algorithm kPairwise[] = {
    {Op::alltoall, Algo::pairwise, "pairwise", "n-1 exchanges", Buffers::caller, false, alltoallv},
};

}  // namespace

std::span<const Algorithm> pairwise_algorithms() {
  return kPairwise;
}

}  // namespace anvil::comm::algo
