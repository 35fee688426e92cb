#include "anvil/comm/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "anvil/base/bf16.hpp"

namespace anvil::comm {
namespace {

template <typename T, typename F>
void combine_many(T* dst, const void* const* srcs, int n, size_t count, F f) {
  const T* s0 = static_cast<const T*>(srcs[0]);
  if (n == 1) {
    if (dst != s0) std::copy(s0, s0 + count, dst);
    return;
  }
  const T* s1 = static_cast<const T*>(srcs[1]);
  for (size_t i = 0; i < count; ++i) dst[i] = f(s0[i], s1[i]);
  for (int k = 2; k < n; ++k) {
    const T* s = static_cast<const T*>(srcs[k]);
    for (size_t i = 0; i < count; ++i) dst[i] = f(dst[i], s[i]);
  }
}

// bf16: widen, combine in fp32 in source order, round once.
template <typename F>
void combine_many_bf16(bf16* dst, const void* const* srcs, int n, size_t count, F f) {
  constexpr size_t kTile = 256;
  float acc[kTile];
  for (size_t base = 0; base < count; base += kTile) {
    const size_t len = std::min(kTile, count - base);
    const bf16* s0 = static_cast<const bf16*>(srcs[0]) + base;
    for (size_t i = 0; i < len; ++i) acc[i] = to_float(s0[i]);
    for (int k = 1; k < n; ++k) {
      const bf16* s = static_cast<const bf16*>(srcs[k]) + base;
      for (size_t i = 0; i < len; ++i) acc[i] = f(acc[i], to_float(s[i]));
    }
    for (size_t i = 0; i < len; ++i) dst[base + i] = to_bf16(acc[i]);
  }
}

template <typename T>
void dispatch_op(T* dst, const void* const* srcs, int n, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return combine_many(dst, srcs, n, count, [](T a, T b) { return a + b; });
    case ReduceOp::max:
      return combine_many(dst, srcs, n, count, [](T a, T b) { return a < b ? b : a; });
    case ReduceOp::min:
      return combine_many(dst, srcs, n, count, [](T a, T b) { return b < a ? b : a; });
  }
}

}  // namespace

void reduce_many(void* dst, const void* const* srcs_in, int n, size_t count, DType t, ReduceOp op) {
  if (count == 0 || n <= 0) return;
  // dst may be one of the sources (in place): combine that one first, before
  // dst is overwritten. Only that rare case copies the list; the hot path
  // (every ring step, every shm chunk) allocates nothing.
  const void* const* srcs = srcs_in;
  std::vector<const void*> reordered;
  for (int k = 1; k < n; ++k) {
    if (srcs_in[k] != dst) continue;
    reordered.assign(srcs_in, srcs_in + n);
    std::swap(reordered[0], reordered[static_cast<size_t>(k)]);
    srcs = reordered.data();
    break;
  }
  switch (t) {
    case DType::f32:
      return dispatch_op(static_cast<float*>(dst), srcs, n, count, op);
    case DType::f64:
      return dispatch_op(static_cast<double*>(dst), srcs, n, count, op);
    case DType::i32:
      return dispatch_op(static_cast<int32_t*>(dst), srcs, n, count, op);
    case DType::i64:
      return dispatch_op(static_cast<int64_t*>(dst), srcs, n, count, op);
    case DType::bf16: {
      bf16* d = static_cast<bf16*>(dst);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          return combine_many_bf16(d, srcs, n, count, [](float a, float b) { return a + b; });
        case ReduceOp::max:
          return combine_many_bf16(d, srcs, n, count,
                                   [](float a, float b) { return a < b ? b : a; });
        case ReduceOp::min:
          return combine_many_bf16(d, srcs, n, count,
                                   [](float a, float b) { return b < a ? b : a; });
      }
    }
  }
}

void reduce_into(void* dst, const void* src, size_t count, DType t, ReduceOp op) {
  const void* srcs[2] = {dst, src};
  reduce_many(dst, srcs, 2, count, t, op);
}

void divide_by(void* x, size_t count, DType t, int n) {
  switch (t) {
    case DType::f32: {
      float* p = static_cast<float*>(x);
      for (size_t i = 0; i < count; ++i) p[i] /= static_cast<float>(n);
      return;
    }
    case DType::f64: {
      double* p = static_cast<double*>(x);
      for (size_t i = 0; i < count; ++i) p[i] /= static_cast<double>(n);
      return;
    }
    case DType::bf16: {
      bf16* p = static_cast<bf16*>(x);
      for (size_t i = 0; i < count; ++i) p[i] = to_bf16(to_float(p[i]) / static_cast<float>(n));
      return;
    }
    default:
      throw std::invalid_argument("avg is defined for floating types only");
  }
}

}  // namespace anvil::comm
