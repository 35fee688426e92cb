// Exact verification data for collectives (as nccl-tests does it): element i
// on rank r holds a small integer, so every reduction order, in every dtype
// including bf16, gives exactly the same result, known in closed form.
#pragma once

#include <algorithm>
#include <cstddef>

#include "anvil/base/bf16.hpp"
#include "anvil/comm/types.hpp"

namespace anvil::comm::check {

// Element i of rank r's input, in [-2, 2].
inline int value(int r, size_t i) {
  return static_cast<int>((static_cast<size_t>(r) * 7 + i * 3) % 5) - 2;
}

// The reduction of element i over n ranks, rounded as dtype t rounds avg.
inline double expected(size_t i, int n, DType t, ReduceOp op) {
  int sum = 0, mx = -100, mn = 100;
  for (int r = 0; r < n; ++r) {
    sum += value(r, i);
    mx = std::max(mx, value(r, i));
    mn = std::min(mn, value(r, i));
  }
  switch (op) {
    case ReduceOp::sum:
      return sum;
    case ReduceOp::max:
      return mx;
    case ReduceOp::min:
      return mn;
    case ReduceOp::avg:
      if (t == DType::f64) return static_cast<double>(sum) / n;
      if (t == DType::bf16)
        return to_float(to_bf16(static_cast<float>(sum) / static_cast<float>(n)));
      return static_cast<float>(sum) / static_cast<float>(n);
  }
  return 0;
}

// All-to-all: element j of the block rank `from` sends to rank `to`; small
// integers (exact in bf16) that say who sent it to whom.
inline double alltoall_value(int from, int to, size_t j) {
  return (from * 8 + to) % 100 + static_cast<double>(j % 3);
}

// Element i of a typed buffer, as a double; and its setter.
double get(const void* buf, size_t i, DType t);
void put(void* buf, size_t i, DType t, double v);

}  // namespace anvil::comm::check
