#include "anvil/optim/device_muon.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "anvil/kernels/device_layers.hpp"

namespace anvil::optim {
namespace {

constexpr float kA = kNewtonSchulzA, kB = kNewtonSchulzB, kC = kNewtonSchulzC;

struct Sizes {
  int64_t momentum = 0;          // the owned matrices' elements
  int64_t matrix = 1, gram = 1;  // the largest owned matrix and Gram matrix, elements
};

Sizes owned_sizes(const model::ParamRegistry& registry, const std::vector<int>& owners, int rank) {
  Sizes s;
  const auto& specs = registry.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (owners[i] != rank) continue;
    const int64_t rows = specs[i].shape[0], cols = specs[i].numel / rows;
    s.momentum += specs[i].numel;
    s.matrix = std::max(s.matrix, specs[i].numel);
    s.gram = std::max(s.gram, std::min(rows, cols) * std::min(rows, cols));
  }
  return s;
}

device::ArenaPlan state_plan(const Sizes& s, bool ns_bf16) {
  device::ArenaPlan plan;
  plan.add(static_cast<size_t>(std::max<int64_t>(1, s.momentum)) * sizeof(float));
  for (int i = 0; i < 3; ++i) plan.add(static_cast<size_t>(s.matrix) * sizeof(float));  // u, x, y
  for (int i = 0; i < 2; ++i) plan.add(static_cast<size_t>(s.gram) * sizeof(float));    // a, b
  if (ns_bf16) {
    plan.add(static_cast<size_t>(s.matrix) * sizeof(bf16));
    plan.add(static_cast<size_t>(s.gram) * sizeof(bf16));
  }
  return plan;
}

Sizes mirror_sizes(const Muon& m) {
  return owned_sizes(m.registry(), m.owners(), m.rank());
}

}  // namespace

size_t DeviceMuon::planned_bytes(const model::ParamRegistry& registry, const MuonConfig& config,
                                 int rank, int world) {
  const Sizes s = owned_sizes(registry, muon_owners(registry, world), rank);
  return state_plan(s, config.ns_bf16).total() + device::ArenaPlan::kAlign * 2;  // + DeviceNorm
}

DeviceMuon::DeviceMuon(Muon& mirror, device::Stream& stream)
    : mirror_(mirror),
      stream_(stream),
      engine_(device::make_gemm_engine(stream.kind())),
      arena_(stream.kind(), "muon state",
             state_plan(mirror_sizes(mirror), mirror.config().ns_bf16)),
      norm_(stream) {
  const Sizes s = mirror_sizes(mirror);
  momentum_ = arena_.take<float>(std::max<int64_t>(1, mirror.momentum_count()));
  u_ = arena_.take<float>(s.matrix);
  x_ = arena_.take<float>(s.matrix);
  y_ = arena_.take<float>(s.matrix);
  a_ = arena_.take<float>(s.gram);
  b_ = arena_.take<float>(s.gram);
  if (mirror.config().ns_bf16) {
    xb_ = arena_.take<bf16>(s.matrix);
    ab_ = arena_.take<bf16>(s.gram);
  }
  upload();
}

void DeviceMuon::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                      const void* b, float beta, float* c) {
  const device::GemmDesc d{.trans_a = ta,
                           .trans_b = tb,
                           .m = m,
                           .n = n,
                           .k = k,
                           .type = xb_ ? Dtype::bf16 : Dtype::fp32,
                           .alpha = alpha,
                           .beta = beta};
  engine_->run(d, a, b, c, nullptr, stream_);
}

float* DeviceMuon::orthogonalise(int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  // X = U / (|U|_F + 1e-7), as muon.cpp's ns_start; on a GPU with no wait
  // on the host (DeviceNorm::scale_to_unit_norm).
  norm_.scale_to_unit_norm(x_, u_, n);
  // Wide (rows <= cols): A = X X^T, Y = a X + B X. Tall: A = X^T X, Y = a X
  // + X B: the wide iteration of X^T, transposed. r is the Gram's side.
  const bool tall = rows > cols;
  const int64_t r = std::min(rows, cols);
  const bool low = xb_ != nullptr;
  float *x = x_, *y = y_;
  for (int s = 0; s < mirror_.config().ns_steps; ++s) {
    const void* xin = x;
    if (low) {
      kernels::dev::convert_to_bf16(stream_, xb_, x, n);
      xin = xb_;
    }
    if (tall)
      gemm(true, false, r, r, rows, 1.0f, xin, xin, 0.0f, a_);  // A = X^T X
    else
      gemm(false, true, r, r, cols, 1.0f, xin, xin, 0.0f, a_);  // A = X X^T
    // B = b A + c A A
    kernels::dev::scale(stream_, b_, a_, r * r, kB);
    const void* ain = a_;
    if (low) {
      kernels::dev::convert_to_bf16(stream_, ab_, a_, r * r);
      ain = ab_;
    }
    gemm(false, false, r, r, r, kC, ain, ain, 1.0f, b_);
    // Y = a X + (B X, or X B when tall)
    kernels::dev::scale(stream_, y, x, n, kA);
    const void* bin = b_;
    if (low) {
      kernels::dev::convert_to_bf16(stream_, ab_, b_, r * r);
      bin = ab_;
    }
    if (tall)
      gemm(false, false, rows, cols, cols, 1.0f, xin, bin, 1.0f, y);
    else
      gemm(false, false, rows, cols, rows, 1.0f, bin, xin, 1.0f, y);
    std::swap(x, y);
  }
  return x;
}

void DeviceMuon::update(float* params, const float* grads, float lr, float grad_scale) {
  const auto& specs = mirror_.registry().specs();
  const MuonConfig& config = mirror_.config();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (mirror_.owners()[i] != mirror_.rank()) continue;  // outside the group, or another rank's
    const auto& s = specs[i];
    const int64_t rows = s.shape[0], cols = s.numel / rows;
    kernels::dev::muon_momentum(stream_, momentum_ + mirror_.momentum_offset(i), u_,
                                grads + s.offset, s.numel, config.momentum, config.nesterov,
                                grad_scale);
    const float* update = orthogonalise(rows, cols);
    const float scale = 0.2f * std::sqrt(static_cast<float>(std::max(rows, cols)));
    const float plr = lr * s.lr_scale;
    const float decay = s.weight_decay ? 1.0f - plr * config.weight_decay : 1.0f;
    kernels::dev::muon_apply(stream_, params + s.offset, update, s.numel, decay, plr * scale);
  }
}

void DeviceMuon::download() {
  const auto bytes = static_cast<size_t>(mirror_.momentum_count()) * sizeof(float);
  device::copy(mirror_.momentum(), momentum_, bytes, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
}

void DeviceMuon::upload() {
  const auto bytes = static_cast<size_t>(mirror_.momentum_count()) * sizeof(float);
  device::copy(momentum_, mirror_.momentum(), bytes, device::CopyKind::host_to_device, stream_);
  stream_.synchronize();
}

}  // namespace anvil::optim
