// optim::DeviceAdamW against the host AdamW on a stream of either kind
// (test_optim.cpp on the CPU, test_gpu_layers.cpp on CUDA): three clipped
// steps over parameters with and without weight decay, the gradient norm
// (the same bits: it is an exact integer sum on either side, NaN for an
// infinity), and the moments through the checkpoint mirror.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "anvil/device/runtime.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/device_adamw.hpp"
#include "support/gpu_test.hpp"

namespace anvil::test_support {

// `rel`: the parameters' and moments' tolerance relative to the host's (0 on
// the CPU, the same loop; a GPU may contract the body's multiply-adds).
inline void expect_device_adamw_is_adamw(device::DeviceKind kind, float rel) {
  model::ParamRegistry r;
  r.add("a", {300}, model::Init::zeros, 0.0f, true);
  r.add("b", {7, 13}, model::Init::zeros, 0.0f, false);
  r.add("c", {1000}, model::Init::zeros, 0.0f, true);
  const int64_t n = r.total();
  const auto bytes = static_cast<size_t>(n) * sizeof(float);
  optim::AdamW host(r, {}), mirror(r, {});
  device::Stream stream(kind);
  optim::DeviceAdamW dev(mirror, stream);
  device::DeviceBuffer dp(kind, bytes, "params"), dg(kind, bytes, "grads");
  std::vector<float> want = uniform_values(static_cast<size_t>(n), 1);
  device::upload(want, dp.data(), stream);
  auto close = [rel](const std::vector<float>& got, const float* w, const char* what) {
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      bad += !(std::fabs(got[i] - w[i]) <= rel * (std::fabs(w[i]) + 1e-6f));
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " differ";
  };
  std::vector<float> grads;
  for (int step = 1; step <= 3; ++step) {
    grads = uniform_values(static_cast<size_t>(n), 10 + step, -1e-3f, 1e-3f);
    grads[5] = 0.5f * static_cast<float>(step);  // a spread of magnitudes; clipping on
    device::upload(grads, dg.data(), stream);
    const double norm = optim::global_norm(grads.data(), n);
    EXPECT_EQ(dev.global_norm(dg.as<float>(), n), norm) << "step " << step;
    const float coef = optim::clip_coefficient(norm, 0.5);
    host.update(want.data(), grads.data(), 1e-2f, step, coef);
    dev.update(dp.as<float>(), dg.as<float>(), 1e-2f, step, coef);
  }
  close(device::download<float>(dp.data(), static_cast<size_t>(n), stream), want.data(), "params");
  dev.download();
  const size_t moments = host.state_bytes() / 2 / sizeof(float);
  close(std::vector<float>(mirror.exp_avg(), mirror.exp_avg() + moments), host.exp_avg(), "m");
  close(std::vector<float>(mirror.exp_avg_sq(), mirror.exp_avg_sq() + moments), host.exp_avg_sq(),
        "v");
  // A loaded mirror goes up: a fourth step from it matches the host's.
  std::copy(host.exp_avg(), host.exp_avg() + moments, mirror.exp_avg());
  std::copy(host.exp_avg_sq(), host.exp_avg_sq() + moments, mirror.exp_avg_sq());
  dev.upload();
  device::upload(want, dp.data(), stream);
  host.update(want.data(), grads.data(), 1e-2f, 4, 1.0f);
  dev.update(dp.as<float>(), dg.as<float>(), 1e-2f, 4, 1.0f);
  close(device::download<float>(dp.data(), static_cast<size_t>(n), stream), want.data(),
        "params after upload");

  grads[7] = std::numeric_limits<float>::infinity();
  device::upload(grads, dg.data(), stream);
  EXPECT_TRUE(std::isnan(dev.global_norm(dg.as<float>(), n)));
  grads[7] = std::numeric_limits<float>::quiet_NaN();
  device::upload(grads, dg.data(), stream);
  EXPECT_TRUE(std::isnan(dev.global_norm(dg.as<float>(), n)));
  std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  device::upload(zeros, dg.data(), stream);
  EXPECT_EQ(dev.global_norm(dg.as<float>(), n), 0.0);
}

}  // namespace anvil::test_support
