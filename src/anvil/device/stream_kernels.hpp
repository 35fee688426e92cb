// The per-element bodies of the memory-bandwidth kernels (STREAM's copy,
// scale, add, triad, plus read-only and write-only), shared by the CPU loops
// of `anvil bench membw` and the CUDA kernels of `--device cuda`, so one CPU
// test covers the arithmetic of both.
#pragma once

#include <cstdint>
#include <string>

#include "anvil/device/gpu_compat.hpp"
#include "anvil/device/runtime.hpp"

namespace anvil::device::stream {

enum class Kernel { copy, scale, add, triad, read, write };

// The scalar of scale, triad and write (STREAM's 3.0).
inline constexpr double kScalar = 3.0;

ANVIL_HD inline double copy(double a) { return a; }
ANVIL_HD inline double scale(double c, double s) { return s * c; }
ANVIL_HD inline double add(double a, double b) { return a + b; }
ANVIL_HD inline double triad(double b, double c, double s) { return b + s * c; }
ANVIL_HD inline double read(double acc, double a) { return acc + a; }
ANVIL_HD inline double write(double s) { return s; }

// Bytes one element moves, as STREAM counts them (no write-allocate traffic).
inline int64_t bytes_per_element(Kernel k) {
  switch (k) {
    case Kernel::copy:
    case Kernel::scale:
      return 16;
    case Kernel::add:
    case Kernel::triad:
      return 24;
    case Kernel::read:
    case Kernel::write:
      return 8;
  }
  return 8;
}

// Arrays (of doubles) a kernel touches.
inline int arrays_of(Kernel k) {
  switch (k) {
    case Kernel::copy:
    case Kernel::scale:
      return 2;
    case Kernel::add:
    case Kernel::triad:
      return 3;
    case Kernel::read:
    case Kernel::write:
      return 1;
  }
  return 1;
}

// `passes` passes of `kernel` over n (even) doubles in CUDA device memory,
// queued on `stream`; `sink` is one device double the read kernel may write.
// The CPU's passes are bench/membw_bench.cpp's threaded loops over the same
// bodies. Throws InputError for a CPU stream or an odd n.
void run_device_passes(Stream& stream, Kernel kernel, double* a, double* b, double* c, int64_t n,
                       int passes, double* sink);

// "copy" -> Kernel::copy; throws InputError naming `flag` otherwise.
Kernel parse_kernel(const std::string& name, const std::string& flag);
std::string to_string(Kernel k);

}  // namespace anvil::device::stream
