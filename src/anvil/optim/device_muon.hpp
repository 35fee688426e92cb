// Muon over parameters and gradients that live on a device (the arenas of
// model::DeviceDecoder), its momentum and Newton-Schulz scratch in that
// device's memory: how `anvil train --device cuda --optimizer muon` steps
// with no copy of the model crossing PCIe. The arithmetic is Muon's
// (muon.hpp): the momentum and the weight update are bodies.hpp's
// muon_momentum and muon_apply (the host Muon runs the same bodies); the
// Frobenius norm that starts the iteration is DeviceNorm's exact sum; the
// iteration's GEMMs run on the device's GemmEngine (cuBLASLt on a GPU), in
// fp32, or with bf16 inputs and fp32 accumulation (`ns_bf16`).
//
// A tall matrix (rows > cols) is not transposed as the host does it: its
// Gram matrix is X^T X (cols x cols) and the iteration's product X B, the
// same polynomial in the same small Gram matrix, so no transpose kernel is
// needed. The products run as full GEMMs (the host multiplies the symmetric
// ones below the diagonal only), so the bits differ from the host Muon's by
// the GEMMs' rounding: within ~1e-6 relative on the CPU device.
//
// Each matrix this rank owns (Muon::owners) is updated; the others are left
// for their owners (the trainer broadcasts them). A host Muon of the same
// registry and layout is the mirror checkpoints read and write: download()
// fills its momentum, upload() takes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "anvil/device/gemm_engine.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/optim/device_norm.hpp"
#include "anvil/optim/muon.hpp"

namespace anvil::optim {

class DeviceMuon {
 public:
  // SystemError when the device memory or its GEMM engine cannot be had.
  DeviceMuon(Muon& mirror, device::Stream& stream);

  // Updates every muon-group matrix the mirror's rank owns, in the
  // registry's flat layout on the device, each gradient times grad_scale.
  void update(float* params, const float* grads, float lr, float grad_scale);
  // The momentum: device -> mirror, and mirror -> device.
  void download();
  void upload();
  // Device bytes it holds (momentum, scratch, the norm's words).
  size_t device_bytes() const { return arena_.capacity() + norm_.device_bytes(); }
  // What a DeviceMuon will hold on data-parallel rank `rank` of `world`
  // (Muon without expert parallelism), for a memory plan; its GEMM engine's
  // workspace (cuBLASLt's 32 MiB) is not counted.
  static size_t planned_bytes(const model::ParamRegistry& registry, const MuonConfig& config,
                              int rank, int world);

 private:
  // x_ = the Newton-Schulz approximation of U V^T for u_ = U S V^T
  // ([rows, cols]); returns where the result is (x_ or y_).
  float* orthogonalise(int64_t rows, int64_t cols);
  // c = alpha op(a) op(b) + beta c, row-major, packed strides.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
            const void* b, float beta, float* c);

  Muon& mirror_;
  device::Stream& stream_;
  std::unique_ptr<device::GemmEngine> engine_;
  device::DeviceArena arena_;
  float* momentum_ = nullptr;
  float *u_ = nullptr, *x_ = nullptr, *y_ = nullptr, *a_ = nullptr, *b_ = nullptr;
  bf16 *xb_ = nullptr, *ab_ = nullptr;  // ns_bf16: the GEMMs' rounded inputs
  DeviceNorm norm_;
};

}  // namespace anvil::optim
