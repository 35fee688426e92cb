// Monotonic wall time in seconds, for timing steps, collectives and
// deadlines (one definition for the whole project).
#pragma once

#include <chrono>

namespace anvil {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace anvil
