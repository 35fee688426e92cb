// What a collective moves and how it combines: element types, reduction
// operators, and the one rule that splits `count` elements into per-rank
// blocks (used by reduce-scatter, all-gather and every ring/halving step).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace anvil::comm {

enum class DType { f32, bf16, f64, i32, i64 };
enum class ReduceOp { sum, max, min, avg };  // avg: floating types only

size_t size_of(DType t);
std::string to_string(DType t);
std::string to_string(ReduceOp op);
bool is_floating(DType t);
// Throw InputError naming `flag` for unknown names.
DType parse_dtype(const std::string& name, const std::string& flag);
ReduceOp parse_reduce_op(const std::string& name, const std::string& flag);

// Block i of `count` elements split over `parts`: the first count % parts
// blocks get one element more. Offsets and sizes in elements.
inline size_t block_count(size_t count, int parts, int i) {
  const size_t p = static_cast<size_t>(parts), idx = static_cast<size_t>(i);
  return count / p + (idx < count % p ? 1 : 0);
}
inline size_t block_offset(size_t count, int parts, int i) {
  const size_t p = static_cast<size_t>(parts), idx = static_cast<size_t>(i);
  return idx * (count / p) + std::min(idx, count % p);
}

}  // namespace anvil::comm
