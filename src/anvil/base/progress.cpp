#include "anvil/base/progress.hpp"

#include <unistd.h>

#include <cstdio>

#include "anvil/base/clock.hpp"

namespace anvil {

void progress_line(bool enabled, size_t done, size_t total, const std::string& what) {
  if (!enabled) return;
  static const bool terminal = ::isatty(STDERR_FILENO) == 1;
  if (terminal) {
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", done, total, what.c_str());
    if (done == total) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    return;
  }
  static double last = now_seconds();  // the first report's interval counts from the first call
  const double now = now_seconds();
  if (done == total || now - last < kProgressLogSeconds) return;
  last = now;
  std::fprintf(stderr, "[%zu/%zu] %s\n", done, total, what.c_str());
  std::fflush(stderr);
}

}  // namespace anvil
