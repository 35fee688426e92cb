// A strided-batch GEMM on an engine of either kind (test_device_seam.cpp on
// the CPU, test_gpu.cpp on cuBLASLt) against each GEMM by the reference
// loop, laid out as the GPU decoder's attention uses it: A's and B's
// matrices inside wider rows (lda > k), advancing by whole row blocks, C
// with a gap between its matrices, beta 1 on the second call.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "anvil/device/gemm.hpp"
#include "anvil/device/gemm_engine.hpp"
#include "anvil/device/runtime.hpp"
#include "support/gpu_test.hpp"

namespace anvil::test_support {

inline void expect_strided_batch_is_each_gemm(device::DeviceKind kind, Dtype type, float rel) {
  auto engine = device::make_gemm_engine(kind);
  device::Stream stream(kind);
  const int64_t batch = 3, m = 33, n = 33, k = 16, ld = 48;  // k of 48-wide rows
  const int64_t sa = m * ld, sb = n * ld, sc = m * n + 7;
  const std::vector<float> a = uniform_values(static_cast<size_t>(batch * sa), 11);
  const std::vector<float> b = uniform_values(static_cast<size_t>(batch * sb), 12);
  std::vector<float> c = uniform_values(static_cast<size_t>(batch * sc), 13);
  device::GemmDesc d;
  d.trans_b = true;
  d.m = m, d.n = n, d.k = k;
  d.lda = ld, d.ldb = ld, d.ldc = n;
  d.type = type;
  d.batch = batch;
  d.stride_a = sa, d.stride_b = sb, d.stride_c = sc;
  ASSERT_EQ(engine->unsupported(d), "");
  std::vector<float> want = c;
  for (float beta : {0.0f, 1.0f}) {
    d.beta = beta;
    for (int64_t i = 0; i < batch; ++i)
      device::gemm(false, true, m, n, k, 1.0f, a.data() + i * sa, ld, b.data() + i * sb, ld, beta,
                   want.data() + i * sc, n, device::GemmBackend::reference);
    if (kind == device::DeviceKind::cpu) {
      engine->run(d, a.data(), b.data(), c.data(), nullptr, stream);
    } else {
      auto da = on_device(a, stream), db = on_device(b, stream), dc = on_device(c, stream);
      engine->run(d, da.data(), db.data(), dc.data(), nullptr, stream);
      c = device::download<float>(dc.data(), c.size(), stream);
    }
  }
  int64_t bad = 0;
  for (size_t i = 0; i < c.size(); ++i)
    bad += !(std::fabs(c[i] - want[i]) <= rel * (1.0f + std::fabs(want[i])));
  EXPECT_EQ(bad, 0) << d.describe() << ": " << bad << " of " << c.size() << " differ";
}

}  // namespace anvil::test_support
