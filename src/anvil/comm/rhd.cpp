// Rabenseifner's all-reduce: recursive-halving reduce-scatter, then
// recursive-doubling all-gather, 2 log2(p) steps moving 2(p-1)/p of the
// message. For n not a power of two, with p = 2^floor(log2 n) and r = n - p,
// the first 2r ranks fold in pairs first (even sends to odd, which reduces),
// the p survivors run the algorithm, and the result is sent back (Thakur,
// Rabenseifner & Gropp 2005).
#include <utility>
#include <vector>

#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm::algo {
namespace {

// In place over `data` (count elements): afterwards every rank holds the reduction.
void rhd_allreduce(PointToPoint& c, void* data, size_t count, DType t, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const size_t es = size_of(t);
  auto* d = static_cast<unsigned char*>(data);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  int log2p = 0;
  for (int q = p; q > 1; q /= 2) ++log2p;
  std::vector<unsigned char> tmp(count * es + 1);
  int step = 0;

  // Fold: ranks below 2*rem pair up; the even one drops out.
  int vr;  // rank among the p survivors, -1 if folded away
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      c.send(d, count * es, r + 1, "allreduce(rhd) fold", step);
      vr = -1;
    } else {
      c.recv(tmp.data(), count * es, r - 1, "allreduce(rhd) fold", step);
      reduce_into(d, tmp.data(), count, t, op);
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  ++step;
  auto real = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };

  if (vr >= 0) {
    // Recursive halving: keep the half of the window on this side of the partner.
    std::vector<std::pair<size_t, size_t>> windows;  // [lo, hi) before each split
    size_t lo = 0, hi = count;
    for (int mask = p / 2; mask >= 1; mask /= 2, ++step) {
      const int partner = real(vr ^ mask);
      const size_t mid = lo + (hi - lo) / 2;
      windows.push_back({lo, hi});
      const bool keep_low = (vr & mask) == 0;
      const size_t keep_lo = keep_low ? lo : mid, keep_hi = keep_low ? mid : hi;
      const size_t give_lo = keep_low ? mid : lo, give_hi = keep_low ? hi : mid;
      c.sendrecv(d + give_lo * es, (give_hi - give_lo) * es, partner, tmp.data(),
                 (keep_hi - keep_lo) * es, partner, "allreduce(rhd) halving", step);
      reduce_into(d + keep_lo * es, tmp.data(), keep_hi - keep_lo, t, op);
      lo = keep_lo;
      hi = keep_hi;
    }
    // Recursive doubling: exchange windows back up the same tree.
    for (int mask = 1; mask < p; mask *= 2, ++step) {
      const int partner = real(vr ^ mask);
      const auto [plo, phi] = windows.back();
      windows.pop_back();
      const bool mine_low = lo == plo;
      const size_t other_lo = mine_low ? hi : plo, other_hi = mine_low ? phi : lo;
      c.sendrecv(d + lo * es, (hi - lo) * es, partner, d + other_lo * es,
                 (other_hi - other_lo) * es, partner, "allreduce(rhd) doubling", step);
      lo = plo;
      hi = phi;
    }
  } else {
    step += 2 * log2p;  // keep step numbers aligned with the survivors'
  }

  // Unfold: the odd ranks give the result back to the even ones that folded.
  if (r < 2 * rem) {
    if (r % 2 == 1) {
      c.send(d, count * es, r - 1, "allreduce(rhd) unfold", step);
    } else {
      c.recv(d, count * es, r + 1, "allreduce(rhd) unfold", step);
    }
  }
}

void allreduce(Context& ctx, const Call& c) {
  rhd_allreduce(ctx.p2p(), c.recv, c.count, c.dtype, c.op);
}

constexpr Algorithm kRhd[] = {
    {Op::allreduce, Algo::rhd, "rhd", "2 log2 p (+2 to fold non-powers of two)", Buffers::in_place,
     false, allreduce},
};

}  // namespace

std::span<const Algorithm> rhd_algorithms() {
  return kRhd;
}

}  // namespace anvil::comm::algo
