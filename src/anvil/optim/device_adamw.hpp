// AdamW over parameters and gradients that live on a device (the arenas of
// model::DeviceDecoder), its moments in that device's memory: how
// `anvil train --device cuda` steps on one process, with no copy of the
// model crossing PCIe per step. The arithmetic is AdamW's (its pieces and
// per-piece constants, kernels::dev::adamw on bodies.hpp's body; on a GPU
// one launch over every piece, its table uploaded per step) and the
// gradient norm is global_norm's exact fixed-point sum (DeviceNorm: two
// device reductions with integer atomics), so a run steps
// by the host optimizer's bits. On a CPU stream the same calls run on the
// CPU, which is how the tests check it.
//
// A host AdamW of the same registry, unsharded, is the mirror checkpoints
// read and write: download() fills it before a save, upload() takes it
// after a load (and at construction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "anvil/device/runtime.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/device_norm.hpp"
#include "anvil/optim/square_sum.hpp"

namespace anvil::optim {

class DeviceAdamW {
 public:
  // SystemError when the device memory cannot be had.
  DeviceAdamW(AdamW& mirror, device::Stream& stream);

  // One step over the device arrays (the registry's flat layout), at `lr`,
  // `step` from 1, each gradient times grad_scale as read.
  void update(float* params, const float* grads, float lr, int64_t step, float grad_scale);
  // global_norm(grads, n) of device gradients: the same bits.
  double global_norm(const float* grads, int64_t n) { return norm_.norm(grads, n); }
  // Its two passes, for a norm over blocks held by several ranks (ZeRO-1):
  // max_abs and scaled_square_sum of optim/square_sum.hpp, the same bits.
  float max_abs(const float* grads, int64_t n) { return norm_.max_abs(grads, n); }
  SquareSum square_sum(const float* grads, int64_t n, int scale) {
    return norm_.square_sum(grads, n, scale);
  }
  // The moments: device -> mirror, and mirror -> device.
  void download();
  void upload();
  // Device bytes it holds (moments and the norm's words).
  size_t device_bytes() const { return arena_.capacity() + norm_.device_bytes(); }

 private:
  AdamW& mirror_;
  device::Stream& stream_;
  size_t moment_bytes_;
  device::DeviceArena arena_;
  float *m_ = nullptr, *v_ = nullptr;
  DeviceNorm norm_;
  // The step's pieces with their constants, and their device copy: one
  // launch for the whole update.
  std::vector<kernels::body::AdamWPiece> pieces_;
  kernels::body::AdamWPiece* table_ = nullptr;
};

}  // namespace anvil::optim
