// Carving a model's buffers out of an arena with one function that both
// plans and places them: run once counting (the bytes an arena of them
// needs, what the memory plan reports), then again over the arena allocated
// for that count. The Decoder's plan/carve discipline (decoder.cpp,
// layout_activations) for models built of layer objects that lay out their
// own buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "anvil/tensor/arena.hpp"

namespace anvil::model {

class Carver {
 public:
  Carver() = default;  // counts; take() returns null
  explicit Carver(tensor::Arena& arena) : arena_(&arena) {}

  // The next `count` elements of T, 64-byte aligned (null while counting).
  template <typename T>
  T* take(int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    bytes_ += tensor::Arena::rounded(bytes);
    return arena_ == nullptr ? nullptr : static_cast<T*>(arena_->take_bytes(bytes));
  }
  size_t bytes() const { return bytes_; }

 private:
  tensor::Arena* arena_ = nullptr;
  size_t bytes_ = 0;
};

// Runs `lay(carver)` counting, allocates one zeroed arena `name` of that
// size and runs it again to carve: the arena is exactly what `lay` takes.
template <typename Lay>
tensor::Arena carve_arena(std::string name, Lay lay) {
  Carver count;
  lay(count);
  tensor::Arena arena(std::move(name), count.bytes());
  Carver place(arena);
  lay(place);
  return arena;
}

}  // namespace anvil::model
