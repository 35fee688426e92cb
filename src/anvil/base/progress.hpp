// Progress of long work on stderr, for every command that has some: a live
// line on a terminal; elsewhere (a log, CI) a plain line at most every
// kProgressLogSeconds, so a short run prints none and a long one is never
// silent for long.
#pragma once

#include <cstddef>
#include <string>

namespace anvil {

inline constexpr double kProgressLogSeconds = 10.0;

// "[done/total] what" when `enabled` (done counts from 0); done == total
// ends it (a terminal's line is cleared).
void progress_line(bool enabled, size_t done, size_t total, const std::string& what);

}  // namespace anvil
