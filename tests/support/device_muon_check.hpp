// optim::DeviceMuon against the host Muon on a stream of either kind
// (test_optim.cpp on the CPU, test_gpu_layers.cpp on CUDA): wide, tall and
// square matrices, two of one shape, a matrix another rank owns (left
// alone) and a vector outside the group (left alone: AdamW's), over three
// steps with a gradient scale, then the momentum through the checkpoint
// mirror and a fourth step from an uploaded one. The updates (p - p0) are
// compared in norm, matrix by matrix: the device runs Newton-Schulz as full
// GEMMs and a tall matrix untransposed, the host the symmetric products
// below the diagonal on the transpose, so the GEMMs round differently.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "anvil/device/runtime.hpp"
#include "anvil/optim/device_muon.hpp"
#include "anvil/optim/muon.hpp"
#include "support/gpu_test.hpp"

namespace anvil::test_support {

// `rel`: the largest |device update - host update| / |host update| per
// matrix, in norm.
inline void expect_device_muon_is_muon(device::DeviceKind kind, bool ns_bf16, double rel) {
  using model::Init;
  using model::OptimizerGroup;
  model::ParamRegistry r;
  // The largest goes to rank 0 (muon_owners: largest first), all the others
  // to rank 1, the rank this checks.
  r.add("other", {64, 64}, Init::zeros, 0.0f, true, OptimizerGroup::muon);
  r.add("wide", {24, 56}, Init::zeros, 0.0f, true, OptimizerGroup::muon);
  r.add("tall", {40, 24}, Init::zeros, 0.0f, false, OptimizerGroup::muon);
  r.add("bias", {33}, Init::zeros, 0.0f, false);
  r.add("square", {32, 32}, Init::zeros, 0.0f, true, OptimizerGroup::muon);
  r.add("twin.0", {16, 48}, Init::zeros, 0.0f, true, OptimizerGroup::muon);
  r.add("twin.1", {16, 48}, Init::zeros, 0.0f, true, OptimizerGroup::muon);
  const int64_t n = r.total();
  ASSERT_EQ(optim::muon_owners(r, 2), (std::vector<int>{0, 1, 1, -1, 1, 1, 1}));
  const auto bytes = static_cast<size_t>(n) * sizeof(float);
  optim::MuonConfig cfg;
  cfg.ns_bf16 = ns_bf16;
  // Rank 1 of 2: the other rank's matrix must stay as it is.
  optim::Muon host(r, cfg, 1, 2), mirror(r, cfg, 1, 2);
  device::Stream stream(kind);
  optim::DeviceMuon dev(mirror, stream);
  device::DeviceBuffer dp(kind, bytes, "params"), dg(kind, bytes, "grads");
  const std::vector<float> p0 = uniform_values(static_cast<size_t>(n), 1, -0.1f, 0.1f);
  std::vector<float> want = p0;
  device::upload(want, dp.data(), stream);
  std::vector<float> grads;
  auto compare = [&](const char* when) {
    const auto got = device::download<float>(dp.data(), static_cast<size_t>(n), stream);
    for (size_t i = 0; i < r.specs().size(); ++i) {
      const auto& s = r.specs()[i];
      double diff = 0, step = 0;
      for (int64_t j = s.offset; j < s.offset + s.numel; ++j) {
        const auto k = static_cast<size_t>(j);
        diff += (static_cast<double>(got[k]) - want[k]) * (static_cast<double>(got[k]) - want[k]);
        step += (static_cast<double>(want[k]) - p0[k]) * (static_cast<double>(want[k]) - p0[k]);
      }
      if (host.owners()[i] != 1) {  // not this rank's to update: untouched on both
        EXPECT_EQ(diff, 0.0) << s.name << " " << when;
        EXPECT_EQ(step, 0.0) << s.name << " " << when;
        continue;
      }
      EXPECT_GT(step, 0.0) << s.name << " " << when;
      EXPECT_LE(std::sqrt(diff / step), rel) << s.name << " " << when;
    }
  };
  for (int step = 1; step <= 3; ++step) {
    grads = uniform_values(static_cast<size_t>(n), 10 + step, -1.0f, 1.0f);
    device::upload(grads, dg.data(), stream);
    host.update(want.data(), grads.data(), 1e-2f, 0.5f);
    dev.update(dp.as<float>(), dg.as<float>(), 1e-2f, 0.5f);
  }
  compare("after 3 steps");
  // The momentum down to the mirror, as a save does it.
  dev.download();
  const auto count = static_cast<size_t>(host.momentum_count());
  double diff = 0, norm = 0;
  for (size_t j = 0; j < count; ++j) {
    diff += std::pow(static_cast<double>(mirror.momentum()[j]) - host.momentum()[j], 2);
    norm += std::pow(static_cast<double>(host.momentum()[j]), 2);
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-6) << "momentum";  // element-wise: no GEMM in it
  // A loaded mirror goes up: a fourth step from the host's momentum and
  // weights matches the host's fourth step.
  std::copy(host.momentum(), host.momentum() + count, mirror.momentum());
  dev.upload();
  device::upload(want, dp.data(), stream);
  const std::vector<float> before = want;
  host.update(want.data(), grads.data(), 1e-2f, 1.0f);
  dev.update(dp.as<float>(), dg.as<float>(), 1e-2f, 1.0f);
  const auto got = device::download<float>(dp.data(), static_cast<size_t>(n), stream);
  for (const auto& s : r.specs()) {
    double d = 0, st = 0;
    for (int64_t j = s.offset; j < s.offset + s.numel; ++j) {
      const auto k = static_cast<size_t>(j);
      d += std::pow(static_cast<double>(got[k]) - want[k], 2);
      st += std::pow(static_cast<double>(want[k]) - before[k], 2);
    }
    if (st > 0) {
      EXPECT_LE(std::sqrt(d / st), rel) << s.name << " after upload";
    }
  }
}

}  // namespace anvil::test_support
