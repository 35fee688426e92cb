// A non-owning view of a tensor: where its data is, its dtype and its shape.
// Views point into an Arena (see arena.hpp) or into a mapped file; they never
// own memory, so copying one is cheap and never copies data.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "anvil/base/bf16.hpp"

namespace anvil::tensor {

enum class DType { f32, bf16 };

inline size_t dtype_size(DType t) {
  return t == DType::f32 ? 4 : 2;
}
inline const char* dtype_name(DType t) {
  return t == DType::f32 ? "f32" : "bf16";
}

std::string shape_string(const std::vector<int64_t>& shape);

// The element count of `shape`, or -1 when a dimension is negative or the
// count does not fit in int64 (readers of files check shapes with this).
inline int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

// The element count of a shape built by the program; a negative dimension or
// an overflowing count is a bug, never a wrapped number.
inline int64_t numel(const std::vector<int64_t>& shape) {
  const int64_t n = checked_numel(shape);
  if (n < 0) {
    throw std::invalid_argument("shape " + shape_string(shape) +
                                ": a negative dimension or more than 2^63 elements");
  }
  return n;
}

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;

  int64_t numel() const { return tensor::numel(shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  float* f32() const { return static_cast<float*>(data); }
  bf16* as_bf16() const { return static_cast<bf16*>(data); }
};

}  // namespace anvil::tensor
