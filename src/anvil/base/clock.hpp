// Monotonic wall time in seconds, for timing steps, collectives and
// deadlines (one definition for the whole project).
#pragma once

#include <chrono>
#include <ctime>
#include <string>

namespace anvil {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Today's date in UTC, ISO-8601 ("2026-12-03"), as profiles and caches record it.
inline std::string today_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace anvil
