// square_sum.hpp's exact norm over values in a device's memory: the largest
// magnitude (integer atomicMax of the float bits on a GPU), then the squares
// in fixed point summed with integer atomics, so the total has the host's
// bits in any order. On a CPU stream the host functions run. One small
// arena of device words per object; each call but scale_to_unit_norm waits
// for its result.
#pragma once

#include <cstdint>

#include "anvil/device/runtime.hpp"
#include "anvil/optim/square_sum.hpp"

namespace anvil::optim {

class DeviceNorm {
 public:
  // SystemError when the device memory cannot be had.
  explicit DeviceNorm(device::Stream& stream);

  // global_norm(x, n): the same bits.
  double norm(const float* x, int64_t n);
  // Its two passes (max_abs and scaled_square_sum), for a norm over blocks
  // held by several ranks (ZeRO-1).
  float max_abs(const float* x, int64_t n);
  SquareSum square_sum(const float* x, int64_t n, int scale);
  // x = u / (|u|_F + 1e-7) (Muon's start, body::muon_unit_factor), x and u
  // on the stream's device. A GPU does it without waiting on the host (a
  // double sum in a fixed order, not the exact one); a CPU stream with the
  // exact norm.
  void scale_to_unit_norm(float* x, const float* u, int64_t n);
  size_t device_bytes() const { return arena_.capacity(); }

 private:
  device::Stream& stream_;
  device::DeviceArena arena_;
  uint32_t* max_bits_ = nullptr;
  unsigned long long* sums_ = nullptr;
  double* partials_ = nullptr;  // the GPU's unit-norm partial sums
  float* factor_ = nullptr;
};

}  // namespace anvil::optim
