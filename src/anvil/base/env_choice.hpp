// An environment variable that picks one of a few named paths
// (ANVIL_BF16, ANVIL_ATTENTION_TILES): unset or empty reads as the first
// choice; any other value outside `choices` is an InputError naming the
// variable and the expected values.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "anvil/base/error.hpp"

namespace anvil {

inline std::string env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* env = std::getenv(name);
  const std::string want = env != nullptr && *env != '\0' ? env : *choices.begin();
  std::string expected;
  size_t i = 0;
  for (const char* c : choices) {
    if (want == c) return want;
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(c);
    ++i;
  }
  throw InputError(std::string(name) + ": unknown value '" + want + "' (expected " + expected +
                   ")");
}

}  // namespace anvil
