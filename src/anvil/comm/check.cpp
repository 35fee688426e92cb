#include "anvil/comm/check.hpp"

#include <cstdint>

namespace anvil::comm::check {

double get(const void* buf, size_t i, DType t) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(buf)[i];
    case DType::f64:
      return static_cast<const double*>(buf)[i];
    case DType::i32:
      return static_cast<const int32_t*>(buf)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::bf16:
      return to_float(static_cast<const bf16*>(buf)[i]);
  }
  return 0;
}

void put(void* buf, size_t i, DType t, double v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::f64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DType::i32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DType::bf16:
      static_cast<bf16*>(buf)[i] = to_bf16(static_cast<float>(v));
      break;
  }
}

}  // namespace anvil::comm::check
