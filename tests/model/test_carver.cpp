// The Carver: counting and carving walk the same layout, so an arena sized
// by the count is used to its last byte, every buffer 64-byte aligned and
// zeroed.
#include <gtest/gtest.h>

#include <cstdint>

#include "anvil/base/bf16.hpp"
#include "anvil/model/carver.hpp"

namespace anvil::model {
namespace {

TEST(Carver, CountingReturnsNullAndSumsTheAlignedSizes) {
  Carver count;
  EXPECT_EQ(count.take<float>(3), nullptr);
  EXPECT_EQ(count.take<int64_t>(16), nullptr);  // 128 bytes: two alignment units
  EXPECT_EQ(count.bytes(), 64u + 128u);
}

TEST(Carver, TheArenaIsExactlyWhatTheLayoutTakes) {
  float* f = nullptr;
  int32_t* i = nullptr;
  int64_t* l = nullptr;
  bf16* b = nullptr;
  const tensor::Arena arena = carve_arena("test", [&](Carver& c) {
    f = c.take<float>(5);
    i = c.take<int32_t>(17);  // 68 bytes: two alignment units
    l = c.take<int64_t>(3);
    b = c.take<bf16>(40);
  });
  EXPECT_EQ(arena.capacity(), 6u * 64);
  EXPECT_EQ(arena.used(), arena.capacity());
  const auto* base = arena.base();
  EXPECT_EQ(reinterpret_cast<const char*>(f), base);
  EXPECT_EQ(reinterpret_cast<const char*>(i), base + 64);
  EXPECT_EQ(reinterpret_cast<const char*>(l), base + 192);
  EXPECT_EQ(reinterpret_cast<const char*>(b), base + 256);
  for (size_t k = 0; k < arena.capacity(); ++k) ASSERT_EQ(base[k], 0) << "byte " << k;
}

}  // namespace
}  // namespace anvil::model
