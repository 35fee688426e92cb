#include "anvil/base/env_choice.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace anvil {
namespace {

constexpr const char* kVar = "ANVIL_TEST_ENV_CHOICE";

TEST(EnvChoice, UnsetOrEmptyIsTheFirstChoiceAndAKnownValueIsItself) {
  unsetenv(kVar);
  EXPECT_EQ(env_choice(kVar, {"auto", "kernel", "blas"}), "auto");
  setenv(kVar, "", 1);
  EXPECT_EQ(env_choice(kVar, {"auto", "kernel", "blas"}), "auto");
  setenv(kVar, "blas", 1);
  EXPECT_EQ(env_choice(kVar, {"auto", "kernel", "blas"}), "blas");
  unsetenv(kVar);
}

TEST(EnvChoice, AnUnknownValueNamesTheVariableAndTheExpectedValues) {
  setenv(kVar, "fast", 1);
  try {
    env_choice(kVar, {"auto", "kernel", "blas"});
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "ANVIL_TEST_ENV_CHOICE: unknown value 'fast' (expected auto, kernel or blas)");
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace anvil
