// Shared by the tests of bad input: a call must throw InputError whose
// message is one line naming what was wrong.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "anvil/base/error.hpp"

namespace anvil::test_support {

// `f` must throw InputError with a one-line message holding each of `parts`.
template <typename F>
void expect_input_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected one naming " << parts.front();
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << "not one line: " << m;
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << p << " not in: " << m;
  }
}

}  // namespace anvil::test_support
