// An arena: one aligned, zeroed allocation that tensors are carved out of.
// The trainer sizes one arena per kind (parameters, gradients, optimizer
// state, activations) from the model config before the first step, so the
// memory plan printed at start is the memory used and nothing is allocated on
// the hot path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "anvil/base/shared_buffer.hpp"

namespace anvil::tensor {

class Arena {
 public:
  Arena() = default;
  // Allocates and zeroes (touching every page) `bytes`; `name` appears in errors.
  // `shared`: in a SharedBuffer (base/shared_buffer.hpp), so that the other
  // ranks of the node read it in place in the shared-memory all-gather and
  // broadcast; private memory where the system refuses one.
  Arena(std::string name, size_t bytes, bool shared = false);
  ~Arena();
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The next `count` floats, 64-byte aligned. Throws if the plan was too small.
  float* take_floats(int64_t count);
  void* take_bytes(size_t bytes);

  const std::string& name() const { return name_; }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  char* base() const { return base_; }

  // The bytes one request of `bytes` occupies (rounded up to the alignment).
  static size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  static constexpr size_t kAlign = 64;

 private:
  std::string name_;
  SharedBuffer shared_;  // holds base_ when the arena is shared
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

}  // namespace anvil::tensor
