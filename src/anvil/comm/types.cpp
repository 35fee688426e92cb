#include "anvil/comm/types.hpp"

#include "anvil/base/error.hpp"

namespace anvil::comm {

size_t size_of(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

std::string to_string(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f64;
}

DType parse_dtype(const std::string& name, const std::string& flag) {
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    if (to_string(t) == name) return t;
  }
  throw InputError(flag + ": expected f32, bf16, f64, i32 or i64, got '" + name + "'");
}

ReduceOp parse_reduce_op(const std::string& name, const std::string& flag) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
    if (to_string(op) == name) return op;
  }
  throw InputError(flag + ": expected sum, max, min or avg, got '" + name + "'");
}

}  // namespace anvil::comm
