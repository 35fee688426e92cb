// The fused attention's layout (fused_attention.hpp), the same in every build.
#include "anvil/device/fused_attention.hpp"

#include <string>

#include "anvil/base/error.hpp"

namespace anvil::device {

AttentionLayout attention_layout(const AttentionShape& s) {
  if (s.B < 1 || s.T < 1 || s.Hq < 1 || s.Hkv < 1 || s.D < 1 || s.Hq % s.Hkv != 0)
    throw InputError("fused attention: expected positive sizes with Hkv dividing Hq, got B " +
                     std::to_string(s.B) + ", T " + std::to_string(s.T) + ", Hq " +
                     std::to_string(s.Hq) + ", Hkv " + std::to_string(s.Hkv) + ", D " +
                     std::to_string(s.D));
  const int64_t row = (s.Hq + 2 * s.Hkv) * s.D;  // one position's q, k and v heads
  const int64_t out_row = s.Hq * s.D;
  AttentionLayout l;
  // Batch b, head h, position t, dim d of qkv: ((b T + t) row + head offset + h D + d).
  l.q = {{s.B, s.Hq, s.T, s.D}, {s.T * row, s.D, row, 1}, 0};
  l.k = {{s.B, s.Hkv, s.T, s.D}, {s.T * row, s.D, row, 1}, s.Hq * s.D};
  l.v = {{s.B, s.Hkv, s.T, s.D}, {s.T * row, s.D, row, 1}, (s.Hq + s.Hkv) * s.D};
  l.out = {{s.B, s.Hq, s.T, s.D}, {s.T * out_row, s.D, out_row, 1}, 0};
  // stats[b][h][t]: packed B, H, T (cuDNN before 9.26 reads no other
  // layout in the backward, and before 9.12 writes no other in the forward).
  l.stats = {{s.B, s.Hq, s.T, 1}, {s.Hq * s.T, s.T, 1, 1}, 0};
  return l;
}

size_t fused_attention_workspace_bound(const AttentionShape& s) {
  const auto up = [](int64_t n, int64_t to) { return (n + to - 1) / to * to; };
  const int64_t heads = s.B * s.Hq;
  int64_t bytes = heads * up(s.T, 64) * up(s.T, 128) * 2;  // dP, bf16
  bytes += heads * s.T * 4;                                // softmax sums
  bytes += heads * s.T * s.D * 4;                          // dQ accumulator
  if (s.Hq != s.Hkv) bytes += 2 * heads * s.T * s.D * 4;   // dK, dV per query head
  return static_cast<size_t>(bytes);
}

}  // namespace anvil::device
