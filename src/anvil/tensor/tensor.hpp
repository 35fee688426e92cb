// A non-owning view of a tensor: where its data is, its dtype and its shape.
// Views point into an Arena (see arena.hpp) or into a mapped file; they never
// own memory, so copying one is cheap and never copies data.
#pragma once

#include <cstdint>
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

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
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

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace anvil::tensor
