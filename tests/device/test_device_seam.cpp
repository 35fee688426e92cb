// The device seam on the CPU: arenas, buffers, streams, events and copies of
// the CPU kind; the CPU GEMM engine with its epilogues against device::gemm
// and the CPU layer's GELU; the shared kernel bodies (stream_kernels.hpp,
// epilogue.hpp) that the CUDA kernels also run, checked here on the CPU; and
// the way a CUDA request fails where no GPU can be used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/device/epilogue.hpp"
#include "anvil/device/fused_attention.hpp"
#include "anvil/device/gemm_engine.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/device/stream_kernels.hpp"
#include "anvil/kernels/layers.hpp"
#include "support/batched_gemm_check.hpp"

namespace anvil::device {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(DeviceSeam, ArenaPlanAlignsEveryRequestTo256Bytes) {
  ArenaPlan plan;
  EXPECT_EQ(plan.add(1), 0u);
  EXPECT_EQ(plan.add(300), 256u);
  EXPECT_EQ(plan.add(256), 768u);
  EXPECT_EQ(plan.total(), 1024u);
  EXPECT_EQ(plan.requests(), 3u);
  DeviceArena arena(DeviceKind::cpu, "test arena", plan);
  EXPECT_EQ(arena.capacity(), 1024u);
  for (size_t bytes : {1u, 300u, 256u}) {
    const auto p = reinterpret_cast<uintptr_t>(arena.take(bytes));
    EXPECT_EQ(p % 256, 0u);
  }
  EXPECT_EQ(arena.used(), 1024u);
  EXPECT_THROW(arena.take(1), SystemError);  // beyond the plan: one allocation, never more
}

TEST(DeviceSeam, CpuBuffersStreamsEventsAndCopies) {
  Stream stream(DeviceKind::cpu);
  DeviceBuffer buf(DeviceKind::cpu, 1000, "buf");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 256, 0u);
  const std::vector<float> host = random_values(250, 1);
  upload(host, buf.data(), stream);
  EXPECT_EQ(download<float>(buf.data(), 250, stream), host);
  zero(buf.data(), 1000, stream);
  EXPECT_EQ(download<float>(buf.data(), 250, stream), std::vector<float>(250, 0.0f));
  Event start(DeviceKind::cpu), stop(DeviceKind::cpu);
  start.record(stream);
  stop.record(stream);
  EXPECT_GE(Event::elapsed_ms(start, stop), 0.0);
  DeviceBuffer moved = std::move(buf);
  EXPECT_EQ(buf.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
}

TEST(DeviceSeam, ParsesDevicesAndSaysWhyCudaIsUnavailable) {
  EXPECT_EQ(parse_device("cpu", "--device"), DeviceKind::cpu);
  EXPECT_EQ(parse_device("cuda", "--device"), DeviceKind::cuda);
  try {
    parse_device("tpu", "--device");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--device: expected cpu or cuda, got 'tpu'");
  }
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present: the unavailable path is not taken";
  EXPECT_EQ(gpu_count(), 0);
  try {
    require(DeviceKind::cuda, "--device");
    FAIL();
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_gemm_engine(DeviceKind::cuda), SystemError);
  EXPECT_THROW(select_gpu(0), SystemError);
  EXPECT_EQ(gpu_for_rank(5), 0);  // no GPU: every rank's is 0, and selecting it fails
}

// The STREAM bodies on the CPU: exactly the arithmetic STREAM defines.
// `anvil hw`'s GPU lines from properties, no GPU needed: the SXM datasheets
// for H100 and H200 SXM only (not NVL, PCIe, GH200 or a MIG slice), CUDA
// versions as X.Y, and no NVML said so.
TEST(DeviceSeam, GpuReportNamesTheDatasheetAndTheVersions) {
  ::setenv("ANVIL_PROFILES", ANVIL_SOURCE_DIR "/profiles", 1);
  auto sheet = [](const char* name, int sms) {
    GpuProperties g;
    g.name = name;
    g.sms = sms;
    const auto p = bench::gpu_datasheet(g);
    return p ? p->name : std::string("none");
  };
  EXPECT_EQ(sheet("NVIDIA H100 80GB HBM3", 132), "h100-sxm");
  EXPECT_EQ(sheet("NVIDIA H200", 132), "h200-sxm");
  EXPECT_EQ(sheet("NVIDIA H100 NVL", 132), "none");
  EXPECT_EQ(sheet("NVIDIA H100 PCIe", 114), "none");
  EXPECT_EQ(sheet("NVIDIA GH200 480GB", 132), "none");
  EXPECT_EQ(sheet("NVIDIA H200 MIG 3g.71gb", 60), "none");
  const nlohmann::json gpus = {{"available", true},
                               {"devices",
                                {{{"ordinal", 0},
                                  {"name", "NVIDIA H200"},
                                  {"compute_capability", "9.0"},
                                  {"sms", 132},
                                  {"clock_ghz", 1.98},
                                  {"memory_bytes", 150e9},
                                  {"l2_bytes", 62914560.0},
                                  {"pci_bus_id", "0000:18:00.0"},
                                  {"pcie_link", "32.0 GT/s PCIe x16"},
                                  {"nvlinks_active", -1},
                                  {"driver_version", 13000},
                                  {"runtime_version", 13000},
                                  {"cublaslt_version", 130100},
                                  {"nccl_version", "2.28.9"}}}}};
  const std::string text = bench::gpu_report_text(gpus);
  EXPECT_NE(text.find("NVLinks active n/a (no NVML)"), std::string::npos) << text;
  EXPECT_NE(text.find("driver for CUDA 13.0, runtime 13.0"), std::string::npos) << text;
  EXPECT_NE(text.find("PCI 0000:18:00.0"), std::string::npos) << text;
}

TEST(DeviceSeam, StreamKernelBodies) {
  const std::vector<double> a = {1.5, -2.0, 0.25, 8.0}, b = {3.0, 0.5, -1.0, 2.0};
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(stream::copy(a[i]), a[i]);
    EXPECT_EQ(stream::scale(a[i], stream::kScalar), 3.0 * a[i]);
    EXPECT_EQ(stream::add(a[i], b[i]), a[i] + b[i]);
    EXPECT_EQ(stream::triad(b[i], a[i], stream::kScalar), b[i] + 3.0 * a[i]);
    EXPECT_EQ(stream::write(stream::kScalar), 3.0);
    sum = stream::read(sum, a[i]);
  }
  EXPECT_EQ(sum, 7.75);
  for (auto k : {stream::Kernel::copy, stream::Kernel::scale, stream::Kernel::add,
                 stream::Kernel::triad, stream::Kernel::read, stream::Kernel::write}) {
    EXPECT_EQ(stream::parse_kernel(stream::to_string(k), "--kernels"), k);
    EXPECT_EQ(stream::bytes_per_element(k), 8 * (stream::arrays_of(k)));
  }
  EXPECT_THROW(stream::parse_kernel("fma", "--kernels"), InputError);
  Stream cpu(DeviceKind::cpu);
  double x[2] = {0, 0};
  EXPECT_THROW(stream::run_device_passes(cpu, stream::Kernel::copy, x, x, x, 2, 1, x), InputError);
}

// The GELU bodies: the CPU layer's GELU and the GEMM epilogues' are the same
// floats; both follow the tanh formula, and the slope its derivative; the
// aux epilogues keep the GELU's input (forward) and apply the slope (backward).
TEST(DeviceSeam, GeluBodiesMatchTheCpuLayerAndTheFormula) {
  const std::vector<float> x = random_values(4096, 2);
  std::vector<float> layer(x.size()), ones(x.size(), 1.0f), slope(x.size());
  kernels::gelu_forward(layer.data(), x.data(), static_cast<int64_t>(x.size()));
  kernels::gelu_backward(slope.data(), x.data(), ones.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], t = std::tanh(kGeluBeta * (v + kGeluKappa * v * v * v));
    const double want = 0.5 * v * (1 + t);
    const double want_slope =
        0.5 * (1 + t) + 0.5 * v * (1 - t * t) * kGeluBeta * (1 + 3 * kGeluKappa * v * v);
    EXPECT_EQ(gelu_tanh(x[i]), layer[i]) << x[i];
    EXPECT_EQ(gelu_tanh_slope(x[i]), slope[i]) << x[i];
    EXPECT_NEAR(gelu_tanh(x[i]), want, 2e-6 * (1 + std::fabs(want))) << x[i];
    EXPECT_NEAR(gelu_tanh_slope(x[i]), want_slope, 2e-6 * (1 + std::fabs(want_slope))) << x[i];
  }
  EXPECT_EQ(apply_epilogue(Epilogue::none, 1.5f, 2.0f), 1.5f);
  EXPECT_EQ(apply_epilogue(Epilogue::bias, 1.5f, 2.0f), 3.5f);
  EXPECT_EQ(apply_epilogue(Epilogue::gelu, 1.5f, 2.0f), gelu_tanh(1.5f));
  EXPECT_EQ(apply_epilogue(Epilogue::bias_gelu, 1.5f, 2.0f), gelu_tanh(3.5f));
  float aux = 0.0f;
  EXPECT_EQ(apply_epilogue(Epilogue::bias_gelu_aux, 1.5f, 2.0f, aux), gelu_tanh(3.5f));
  EXPECT_EQ(aux, 3.5f);
  EXPECT_EQ(apply_epilogue(Epilogue::dgelu, 1.5f, 2.0f, aux), 1.5f * gelu_tanh_slope(3.5f));
  EXPECT_EQ(aux, 3.5f);
  EXPECT_TRUE(uses_aux(Epilogue::dgelu) && has_bias(Epilogue::bias_gelu_aux));
  EXPECT_FALSE(uses_aux(Epilogue::bias_gelu) || has_bias(Epilogue::dgelu));
}

// Pinned host memory for device copies: zeroed, aligned, moved without a copy.
TEST(DeviceSeam, PinnedHostBufferIsZeroedAlignedAndMovable) {
  DeviceBuffer h(DeviceKind::cpu, 1000, "host", Memory::pinned_host);
  EXPECT_EQ(h.bytes(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data()) % 256, 0u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(h.as<unsigned char>()[i], 0);
  float* p = h.as<float>();
  DeviceBuffer moved(std::move(h));
  EXPECT_EQ(moved.as<float>(), p);
  EXPECT_EQ(h.data(), nullptr);              // NOLINT(bugprone-use-after-move): moved from is empty
  if (!cuda_unavailable_reason().empty()) {  // no driver, or no CUDA in the build
    EXPECT_THROW(DeviceBuffer(DeviceKind::cuda, 8, "x", Memory::pinned_host), SystemError);
  }
}

// A strided batch (the GPU decoder's attention, one launch per head) gives
// each GEMM's result, the gaps between C's matrices untouched.
TEST(DeviceSeam, CpuGemmEngineRunsAStridedBatch) {
  test_support::expect_strided_batch_is_each_gemm(DeviceKind::cpu, Dtype::fp32, 1e-5f);
}

// The CPU engine: device::gemm, then the epilogue, for fp32 and bf16 inputs.
TEST(DeviceSeam, CpuGemmEngineWithEpilogues) {
  auto engine = make_gemm_engine(DeviceKind::cpu);
  Stream stream(DeviceKind::cpu);
  const int64_t m = 37, n = 29, k = 45;
  for (Dtype type : {Dtype::fp32, Dtype::bf16}) {
    for (Epilogue e : {Epilogue::none, Epilogue::bias, Epilogue::gelu, Epilogue::bias_gelu,
                       Epilogue::bias_gelu_aux, Epilogue::dgelu}) {
      GemmDesc d;
      d.trans_b = true;
      d.m = m, d.n = n, d.k = k;
      d.type = type;
      d.epilogue = e;
      ASSERT_EQ(engine->unsupported(d), "");
      const auto a_bytes = encode(random_values(m * k, 3), type);
      const auto b_bytes = encode(random_values(n * k, 4), type);
      const std::vector<float> bias = random_values(n, 5);
      std::vector<float> c(m * n, 0.0f), plain(m * n, 0.0f);
      const std::vector<float> aux_in = random_values(m * n, 6);  // dgelu reads it
      std::vector<float> aux = aux_in;
      engine->run(d, a_bytes.data(), b_bytes.data(), c.data(), bias.data(), stream, -1, aux.data());
      // The reference: the same (encoded) inputs through the reference loop.
      const auto a = decode(a_bytes, type), b = decode(b_bytes, type);
      gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, plain.data(), n,
           GemmBackend::reference);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          float want_aux = aux_in[i * n + j];
          const float want = apply_epilogue(e, plain[i * n + j], bias[j], want_aux);
          EXPECT_NEAR(c[i * n + j], want, 1e-4f * (1.0f + std::fabs(want)))
              << to_string(e) << " " << anvil::to_string(type);
          EXPECT_NEAR(aux[i * n + j], want_aux, 1e-4f * (1.0f + std::fabs(want_aux)))
              << to_string(e);
        }
      }
    }
  }
  GemmDesc no_aux;
  no_aux.m = no_aux.n = no_aux.k = 2;
  no_aux.epilogue = Epilogue::dgelu;
  float z[4] = {};
  EXPECT_THROW(engine->run(no_aux, z, z, z, nullptr, stream), InputError);
  no_aux.batch = 2;
  EXPECT_NE(engine->unsupported(no_aux), "");
  GemmDesc half;
  half.type = Dtype::fp16;
  EXPECT_NE(engine->unsupported(half), "");
  EXPECT_THROW(engine->run(half, nullptr, nullptr, nullptr, nullptr, stream), InputError);
}

TEST(DeviceSeam, EncodesGemmTypes) {
  const std::vector<float> v = {1.0f, -0.5f, 3.140625f, 1e-3f};
  EXPECT_EQ(decode(encode(v, Dtype::fp32), Dtype::fp32), v);
  const auto b = decode(encode(v, Dtype::bf16), Dtype::bf16);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(b[i], v[i], std::fabs(v[i]) / 128);
  EXPECT_EQ(dtype_bytes(Dtype::fp8), 1u);
  EXPECT_EQ(dtype_bytes(Dtype::fp16), 2u);
  EXPECT_EQ(dtype_bytes(Dtype::tf32), 4u);
  if (!cuda_built()) GTEST_SKIP() << "fp16/fp8 encodings come from the CUDA headers; no CUDA here";
  const auto h = decode(encode(v, Dtype::fp16), Dtype::fp16);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(h[i], v[i], std::fabs(v[i]) / 1024);
  const auto f8 = decode(encode(v, Dtype::fp8), Dtype::fp8);
  EXPECT_EQ(f8[0], 1.0f);
  EXPECT_EQ(f8[1], -0.5f);
  EXPECT_EQ(f8[2], 3.25f);  // e4m3: 3 mantissa bits, round to nearest
}

// cuDNN is told the decoder's own layout by strides: each [batch, head,
// position, dim] element of q, k, v, out and the statistics lands where the
// unfused attention reads and writes it (GQA: 6 query heads over 2 kv heads).
TEST(DeviceSeam, FusedAttentionLayoutAddressesTheDecodersBuffers) {
  const AttentionShape s{2, 5, 6, 2, 4, 0.5f};
  const AttentionLayout l = attention_layout(s);
  const int64_t row = (s.Hq + 2 * s.Hkv) * s.D, out_row = s.Hq * s.D;
  const auto at = [](const AttentionTensor& t, int64_t b, int64_t h, int64_t p, int64_t d) {
    return t.offset + b * t.strides[0] + h * t.strides[1] + p * t.strides[2] + d * t.strides[3];
  };
  EXPECT_EQ(l.q.dims, (std::array<int64_t, 4>{2, 6, 5, 4}));
  EXPECT_EQ(l.k.dims, (std::array<int64_t, 4>{2, 2, 5, 4}));
  EXPECT_EQ(l.stats.dims, (std::array<int64_t, 4>{2, 6, 5, 1}));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t p = 0; p < s.T; ++p) {
      const int64_t r = b * s.T + p;
      for (int64_t d = 0; d < s.D; ++d) {
        for (int64_t h = 0; h < s.Hq; ++h) {
          EXPECT_EQ(at(l.q, b, h, p, d), r * row + h * s.D + d);
          EXPECT_EQ(at(l.out, b, h, p, d), r * out_row + h * s.D + d);
        }
        for (int64_t g = 0; g < s.Hkv; ++g) {
          EXPECT_EQ(at(l.k, b, g, p, d), r * row + (s.Hq + g) * s.D + d);
          EXPECT_EQ(at(l.v, b, g, p, d), r * row + (s.Hq + s.Hkv + g) * s.D + d);
        }
      }
      for (int64_t h = 0; h < s.Hq; ++h)
        EXPECT_EQ(at(l.stats, b, h, p, 0), (b * s.Hq + h) * s.T + p);  // packed [b][h][t]
    }
  EXPECT_THROW(attention_layout({2, 5, 6, 4, 4, 0.5f}), InputError);  // 4 kv heads for 6
  if (!cuda_unavailable_reason().empty()) {
    EXPECT_FALSE(fused_attention_unavailable().empty());
    Stream cpu;
    EXPECT_THROW(FusedAttention(s, cpu), SystemError);
  }
}

// The memory plan's bound on cuDNN's workspace: the deterministic
// backward's bf16 dP (T rounded up to 64 by 128), the softmax sums, an fp32
// dQ accumulator, and with GQA dK and dV for every query head.
TEST(DeviceSeam, FusedAttentionWorkspaceBoundCountsEachBuffer) {
  const size_t dp = 2 * 4 * 128 * 128 * 2, sums = 2 * 4 * 100 * 4, dq = 2 * 4 * 100 * 8 * 4;
  EXPECT_EQ(fused_attention_workspace_bound({2, 100, 4, 4, 8, 1.0f}), dp + sums + dq);
  EXPECT_EQ(fused_attention_workspace_bound({2, 100, 4, 2, 8, 1.0f}), dp + sums + 3 * dq);
}

}  // namespace
}  // namespace anvil::device
