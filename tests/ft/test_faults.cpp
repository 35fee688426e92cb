// Fault injection specs (`--inject KIND@STEP[:RANK][=ARG]`): what parses, and
// one-line errors naming the option and the expected form for what does not.
#include <gtest/gtest.h>

#include <string>

#include "anvil/ft/faults.hpp"
#include "support/input_error.hpp"

namespace anvil::ft {
namespace {

TEST(Faults, InjectionSpecsParseOrNameTheExpectedForm) {
  const Fault k = parse_fault("kill@30:1");
  EXPECT_EQ(k.kind, "kill");
  EXPECT_EQ(k.step, 30);
  EXPECT_EQ(k.rank, 1);
  const Fault s = parse_fault("slow@5=200");
  EXPECT_EQ(s.kind, "slow");
  EXPECT_EQ(s.rank, 0);
  EXPECT_DOUBLE_EQ(s.arg, 200);
  const Fault w = parse_fault("kill-in-save@20:3=5.5");
  EXPECT_EQ(w.kind, "kill-in-save");
  EXPECT_EQ(w.rank, 3);
  EXPECT_DOUBLE_EQ(w.arg, 5.5);
  for (const char* bad : {"kill", "kill@", "kill@0", "boom@3", "kill@3:x", "kill@3:1=", "slow@3",
                          "kill@3x", "nan@-1", "@3", "kill,hang@3"}) {
    test_support::expect_input_error(
        [&] { parse_fault(bad); },
        {"faults.inject: ", "KIND@STEP[:RANK][=ARG]", "got '" + std::string(bad) + "'"});
  }
}

}  // namespace
}  // namespace anvil::ft
