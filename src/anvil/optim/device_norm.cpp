#include "anvil/optim/device_norm.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "anvil/kernels/device_layers.hpp"
#include "anvil/kernels/gpu_layers.hpp"

namespace anvil::optim {
namespace {

device::ArenaPlan words_plan() {
  device::ArenaPlan plan;
  plan.add(sizeof(uint32_t));
  plan.add(2 * sizeof(unsigned long long));
  plan.add(kernels::gpu::kUnitPartials * sizeof(double));
  plan.add(sizeof(float));
  return plan;
}

}  // namespace

DeviceNorm::DeviceNorm(device::Stream& stream)
    : stream_(stream), arena_(stream.kind(), "norm words", words_plan()) {
  max_bits_ = arena_.take<uint32_t>(1);
  sums_ = arena_.take<unsigned long long>(2);
  partials_ = arena_.take<double>(kernels::gpu::kUnitPartials);
  factor_ = arena_.take<float>(1);
}

void DeviceNorm::scale_to_unit_norm(float* x, const float* u, int64_t n) {
  if (stream_.kind() == device::DeviceKind::cpu) {
    kernels::dev::scale(stream_, x, u, n, kernels::body::muon_unit_factor(norm(u, n)));
    return;
  }
  kernels::gpu::scale_to_unit_norm(x, u, n, partials_, factor_, stream_.native());
}

double DeviceNorm::norm(const float* x, int64_t n) {
  // The largest magnitude first: it fixes the fixed-point scale.
  const float largest = max_abs(x, n);
  if (!(largest > 0)) return std::isnan(largest) ? static_cast<double>(largest) : 0.0;
  const int scale = square_scale(largest);
  return std::sqrt(square_sum_value(square_sum(x, n, scale), scale));
}

float DeviceNorm::max_abs(const float* x, int64_t n) {
  if (stream_.kind() == device::DeviceKind::cpu) return optim::max_abs(x, n);
  device::zero(max_bits_, sizeof(uint32_t), stream_);
  kernels::gpu::max_abs_bits(x, n, max_bits_, stream_.native());
  uint32_t bits = 0;
  device::copy(&bits, max_bits_, sizeof bits, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
  if (bits >= 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();  // NaN or infinity
  float largest;
  std::memcpy(&largest, &bits, sizeof largest);
  return largest;
}

SquareSum DeviceNorm::square_sum(const float* x, int64_t n, int scale) {
  if (stream_.kind() == device::DeviceKind::cpu) return scaled_square_sum(x, n, scale);
  device::zero(sums_, 2 * sizeof(unsigned long long), stream_);
  kernels::gpu::fixed_square_sum(x, n, std::ldexp(1.0, scale), sums_, stream_.native());
  unsigned long long sums[2] = {0, 0};
  device::copy(sums, sums_, sizeof sums, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
  // The kernel's low word reaches ~2^61 on a large range: carried into
  // 42-bit limbs, so ZeRO's sums over ranges and ranks cannot overflow.
  return square_sum_of_words(sums[0], sums[1]);
}

}  // namespace anvil::optim
