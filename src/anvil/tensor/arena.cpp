#include "anvil/tensor/arena.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "anvil/base/error.hpp"

namespace anvil::tensor {

Arena::Arena(std::string name, size_t bytes, bool shared) : name_(std::move(name)) {
  capacity_ = rounded(bytes);
  if (capacity_ == 0) return;
  if (shared) {
    try {
      shared_ = SharedBuffer(capacity_, name_.c_str());
      base_ = reinterpret_cast<char*>(shared_.data());
    } catch (const SystemError&) {
      // No memory files here (a sandbox without memfd_create): private memory.
    }
  }
  if (base_ == nullptr) base_ = static_cast<char*>(std::aligned_alloc(kAlign, capacity_));
  if (base_ == nullptr) {
    throw SystemError("arena " + name_ + ": cannot allocate " + std::to_string(capacity_) +
                      " bytes");
  }
  std::memset(base_, 0, capacity_);
}

Arena::~Arena() {
  if (shared_.data() == nullptr) std::free(base_);
}

Arena::Arena(Arena&& other) noexcept
    : name_(std::move(other.name_)),
      shared_(std::move(other.shared_)),
      base_(std::exchange(other.base_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      used_(std::exchange(other.used_, 0)) {}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    if (shared_.data() == nullptr) std::free(base_);
    name_ = std::move(other.name_);
    shared_ = std::move(other.shared_);
    base_ = std::exchange(other.base_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    used_ = std::exchange(other.used_, 0);
  }
  return *this;
}

void* Arena::take_bytes(size_t bytes) {
  const size_t need = rounded(bytes);
  if (used_ + need > capacity_) {
    throw SystemError("arena " + name_ + ": plan too small (" + std::to_string(capacity_) +
                      " bytes, asked for " + std::to_string(used_ + need) + ")");
  }
  void* p = base_ + used_;
  used_ += need;
  return p;
}

float* Arena::take_floats(int64_t count) {
  return static_cast<float*>(take_bytes(static_cast<size_t>(count) * sizeof(float)));
}

}  // namespace anvil::tensor

#include "anvil/tensor/tensor.hpp"

namespace anvil::tensor {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace anvil::tensor
