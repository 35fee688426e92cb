// Shared by the GPU tests (anvil_gpu_tests): a fixture base that skips with
// the reason where no CUDA device can be used, uniform random host values,
// and a device copy of a host vector.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "anvil/device/runtime.hpp"

namespace anvil::test_support {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = device::cuda_unavailable_reason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

inline std::vector<float> uniform_values(size_t n, uint32_t seed, float lo = -1.0f,
                                         float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

template <class T>
device::DeviceBuffer on_device(const std::vector<T>& host, device::Stream& stream) {
  device::DeviceBuffer b(device::DeviceKind::cuda, std::max<size_t>(1, host.size() * sizeof(T)),
                         "test");
  device::upload(host, b.data(), stream);
  return b;
}

}  // namespace anvil::test_support
