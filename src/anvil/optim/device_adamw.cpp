#include "anvil/optim/device_adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "anvil/kernels/device_layers.hpp"
#include "anvil/kernels/gpu_layers.hpp"
#include "anvil/optim/square_sum.hpp"

namespace anvil::optim {
namespace {

device::ArenaPlan state_plan(size_t moment_bytes, size_t pieces) {
  device::ArenaPlan plan;
  plan.add(moment_bytes);
  plan.add(moment_bytes);
  plan.add(sizeof(uint32_t));
  plan.add(2 * sizeof(unsigned long long));
  plan.add(std::max<size_t>(1, pieces) * sizeof(kernels::body::AdamWPiece));
  return plan;
}

}  // namespace

DeviceAdamW::DeviceAdamW(AdamW& mirror, device::Stream& stream)
    : mirror_(mirror),
      stream_(stream),
      moment_bytes_(mirror.state_bytes() / 2),
      arena_(stream.kind(), "adamw state", state_plan(moment_bytes_, mirror.pieces().size())) {
  m_ = static_cast<float*>(arena_.take(moment_bytes_));
  v_ = static_cast<float*>(arena_.take(moment_bytes_));
  max_bits_ = arena_.take<uint32_t>(1);
  sums_ = arena_.take<unsigned long long>(2);
  table_ = arena_.take<kernels::body::AdamWPiece>(std::max<size_t>(1, mirror.pieces().size()));
  upload();
}

void DeviceAdamW::update(float* params, const float* grads, float lr, int64_t step,
                         float grad_scale) {
  pieces_.clear();
  for (const AdamW::Piece& piece : mirror_.pieces()) {
    pieces_.push_back(
        {piece.begin, piece.local, piece.end - piece.begin, mirror_.constants(piece, lr, step)});
  }
  kernels::dev::adamw(stream_, params, m_, v_, grads, pieces_, table_, grad_scale);
}

double DeviceAdamW::global_norm(const float* grads, int64_t n) {
  // The largest magnitude first: it fixes the fixed-point scale.
  const float largest = max_abs(grads, n);
  if (!(largest > 0)) return std::isnan(largest) ? static_cast<double>(largest) : 0.0;
  const int scale = square_scale(largest);
  return std::sqrt(square_sum_value(square_sum(grads, n, scale), scale));
}

float DeviceAdamW::max_abs(const float* grads, int64_t n) {
  if (stream_.kind() == device::DeviceKind::cpu) return optim::max_abs(grads, n);
  device::zero(max_bits_, sizeof(uint32_t), stream_);
  kernels::gpu::max_abs_bits(grads, n, max_bits_, stream_.native());
  uint32_t bits = 0;
  device::copy(&bits, max_bits_, sizeof bits, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
  if (bits >= 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();  // NaN or infinity
  float largest;
  std::memcpy(&largest, &bits, sizeof largest);
  return largest;
}

SquareSum DeviceAdamW::square_sum(const float* grads, int64_t n, int scale) {
  if (stream_.kind() == device::DeviceKind::cpu) return scaled_square_sum(grads, n, scale);
  device::zero(sums_, 2 * sizeof(unsigned long long), stream_);
  kernels::gpu::fixed_square_sum(grads, n, std::ldexp(1.0, scale), sums_, stream_.native());
  unsigned long long sums[2] = {0, 0};
  device::copy(sums, sums_, sizeof sums, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
  SquareSum total;  // sums[1] x 2^42 + sums[0]: the limbs' reading of it
  total.limbs[0] = static_cast<int64_t>(sums[0]);
  total.limbs[1] = static_cast<int64_t>(sums[1]);
  return total;
}

void DeviceAdamW::download() {
  device::copy(mirror_.exp_avg(), m_, moment_bytes_, device::CopyKind::device_to_host, stream_);
  device::copy(mirror_.exp_avg_sq(), v_, moment_bytes_, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
}

void DeviceAdamW::upload() {
  device::copy(m_, mirror_.exp_avg(), moment_bytes_, device::CopyKind::host_to_device, stream_);
  device::copy(v_, mirror_.exp_avg_sq(), moment_bytes_, device::CopyKind::host_to_device, stream_);
  stream_.synchronize();
}

}  // namespace anvil::optim
