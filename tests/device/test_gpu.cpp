// Every CUDA path against the CPU on the same inputs (CTest label `gpu`):
// cuBLASLt per dtype, transposition and epilogue against the CPU reference
// GEMM; the memory-bandwidth kernels against the same bodies run on the CPU;
// NCCL against comm/'s exact checks; device arenas. Where no GPU can be used
// every test is skipped with the reason, and test_device_seam.cpp's CPU tests
// of the shared bodies are what runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/device/collectives.hpp"
#include "anvil/device/gemm_engine.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/device/stream_kernels.hpp"
#include "support/batched_gemm_check.hpp"

namespace anvil::device {
namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Relative tolerance per output element, of sum_k |a_ik b_kj| (the scale of
// the rounding any summation order makes), for each type's multiply and output.
float tolerance(Dtype type, bool out_f32) {
  // tf32: 10-bit mantissa products; fp8: Hopper's tensor cores add fp8
  // products in a narrower accumulator (about 14 bits) between cuBLASLt's
  // promotions to fp32.
  float t = type == Dtype::tf32 ? 2e-3f : type == Dtype::fp8 ? 2.5e-4f : 2e-5f;
  if (!out_f32) t += type == Dtype::fp16 ? 1e-3f : 8e-3f;  // the 16-bit output's rounding
  return t;
}

void check_gemm(GemmEngine& engine, const GemmDesc& d) {
  Stream stream(DeviceKind::cuda);
  const int64_t a_rows = d.trans_a ? d.k : d.m, a_cols = d.trans_a ? d.m : d.k;
  const int64_t b_rows = d.trans_b ? d.n : d.k, b_cols = d.trans_b ? d.k : d.n;
  const auto a_bytes = encode(random_values(a_rows * a_cols, 1), d.type);
  const auto b_bytes = encode(random_values(b_rows * b_cols, 2), d.type);
  const Dtype out = d.out_type();
  const auto bias_bytes = encode(random_values(d.n, 3), out);
  DeviceBuffer a(DeviceKind::cuda, a_bytes.size(), "A"), b(DeviceKind::cuda, b_bytes.size(), "B"),
      bias(DeviceKind::cuda, bias_bytes.size(), "bias"),
      c(DeviceKind::cuda, d.m * d.n * dtype_bytes(out), "C");
  upload(a_bytes, a.data(), stream);
  upload(b_bytes, b.data(), stream);
  upload(bias_bytes, bias.data(), stream);
  engine.run(d, a.data(), b.data(), c.data(), bias.data(), stream);
  const auto got = decode(download<unsigned char>(c.data(), c.bytes(), stream), out);
  // The CPU reference on the decoded (exactly representable) inputs.
  const auto af = decode(a_bytes, d.type), bf = decode(b_bytes, d.type);
  const auto biasf = decode(bias_bytes, out);
  std::vector<float> want(d.m * d.n), scale(d.m * d.n);
  std::vector<float> abs_a(af.size()), abs_b(bf.size());
  for (size_t i = 0; i < af.size(); ++i) abs_a[i] = std::fabs(af[i]);
  for (size_t i = 0; i < bf.size(); ++i) abs_b[i] = std::fabs(bf[i]);
  gemm(d.trans_a, d.trans_b, d.m, d.n, d.k, 1.0f, af.data(), a_cols, bf.data(), b_cols, 0.0f,
       want.data(), d.n, GemmBackend::reference);
  gemm(d.trans_a, d.trans_b, d.m, d.n, d.k, 1.0f, abs_a.data(), a_cols, abs_b.data(), b_cols, 0.0f,
       scale.data(), d.n, GemmBackend::reference);
  const float tol = tolerance(d.type, d.out_f32 || out == Dtype::fp32);
  int64_t bad = 0;
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = 0; j < d.n; ++j) {
      const size_t at = static_cast<size_t>(i * d.n + j);
      const float w = apply_epilogue(d.epilogue, want[at], biasf[static_cast<size_t>(j)]);
      bad += !(std::fabs(got[at] - w) <= tol * (scale[at] + std::fabs(biasf[j]) + 1e-6f));
    }
  }
  EXPECT_EQ(bad, 0) << d.describe();
}

// cuBLASLt's strided batch (BATCH_COUNT, STRIDED_BATCH_OFFSET) as the GPU
// decoder's attention uses it.
TEST_F(Gpu, CublasLtStridedBatchIsEachGemm) {
  test_support::expect_strided_batch_is_each_gemm(DeviceKind::cuda, Dtype::fp32, 1e-5f);
}

TEST_F(Gpu, CublasLtEveryTypeAgainstTheCpu) {
  auto engine = make_gemm_engine(DeviceKind::cuda);
  const GpuProperties gpu = gpu_properties(0);
  for (Dtype type : {Dtype::fp32, Dtype::tf32, Dtype::bf16, Dtype::fp16, Dtype::fp8}) {
    if (type == Dtype::fp8 && !gpu.has_fp8) continue;
    for (bool out_f32 : {true, false}) {
      GemmDesc d;
      d.type = type;
      d.out_f32 = out_f32;
      d.m = 96, d.n = 80, d.k = 144;
      d.trans_b = true;
      check_gemm(*engine, d);
    }
  }
}

TEST_F(Gpu, CublasLtTranspositionsAndOddShapes) {
  auto engine = make_gemm_engine(DeviceKind::cuda);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (Dtype type : {Dtype::fp32, Dtype::bf16}) {
        GemmDesc d;
        d.type = type;
        d.trans_a = ta, d.trans_b = tb;
        d.m = 64, d.n = 40, d.k = 72;  // multiples of 8: bf16 rows stay 16-byte aligned
        check_gemm(*engine, d);
      }
    }
  }
}

TEST_F(Gpu, CublasLtEpiloguesAgainstTheCpuBodies) {
  auto engine = make_gemm_engine(DeviceKind::cuda);
  for (Epilogue e : {Epilogue::bias, Epilogue::gelu, Epilogue::bias_gelu}) {
    for (Dtype type : {Dtype::fp32, Dtype::bf16}) {
      GemmDesc d;
      d.type = type;
      d.out_f32 = type == Dtype::fp32;
      d.epilogue = e;
      d.m = 128, d.n = 64, d.k = 96;
      d.trans_b = true;
      check_gemm(*engine, d);
    }
  }
}

// The MLP's fused GELU: bias_gelu_aux (output and kept input) and dgelu
// (slope applied to the product) on cuBLASLt against the CPU engine on the
// same inputs, where cuBLASLt fuses them (row stride a multiple of 8) and
// where the engine runs them as a kernel after the GEMM (61 columns).
TEST_F(Gpu, CublasLtAuxEpiloguesMatchTheCpuEngine) {
  auto gpu = make_gemm_engine(DeviceKind::cuda);
  auto cpu = make_gemm_engine(DeviceKind::cpu);
  Stream stream(DeviceKind::cuda), host(DeviceKind::cpu);
  for (int64_t n : {64, 61}) {
    for (Dtype type : {Dtype::fp32, Dtype::bf16}) {
      for (Epilogue e : {Epilogue::bias_gelu_aux, Epilogue::dgelu}) {
        GemmDesc d;
        d.type = type;
        d.epilogue = e;
        d.m = 96, d.n = n, d.k = 80;
        d.trans_b = true;
        const auto a_bytes = encode(random_values(d.m * d.k, 1), type);
        const auto b_bytes = encode(random_values(d.n * d.k, 2), type);
        const auto bias = random_values(d.n, 3);
        const auto aux_in = random_values(d.m * d.n, 4);
        std::vector<float> want(d.m * d.n), want_aux = aux_in;
        cpu->run(d, a_bytes.data(), b_bytes.data(), want.data(), bias.data(), host, -1,
                 want_aux.data());
        DeviceBuffer a(DeviceKind::cuda, a_bytes.size(), "A"),
            b(DeviceKind::cuda, b_bytes.size(), "B"), db(DeviceKind::cuda, n * 4, "bias"),
            c(DeviceKind::cuda, want.size() * 4, "C"),
            aux(DeviceKind::cuda, want.size() * 4, "aux");
        upload(a_bytes, a.data(), stream);
        upload(b_bytes, b.data(), stream);
        upload(bias, db.data(), stream);
        upload(aux_in, aux.data(), stream);
        gpu->run(d, a.data(), b.data(), c.data(), db.data(), stream, -1, aux.data());
        // Whether this ran fused is for the GPU check's log, not a requirement.
        if (n % 8 == 0)
          std::printf("cuBLASLt %s: %d fused algorithm(s)\n", d.describe().c_str(),
                      gpu->candidates(d, 1));
        const auto got = download<float>(c.data(), c.bytes(), stream);
        const auto got_aux = download<float>(aux.data(), aux.bytes(), stream);
        float scale = 0;
        for (float v : want) scale = std::max(scale, std::fabs(v));
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-4f * scale) << d.describe() << " at " << i;
          ASSERT_NEAR(got_aux[i], want_aux[i], 1e-4f * (1 + std::fabs(want_aux[i])))
              << d.describe() << " aux at " << i;
        }
      }
    }
  }
}

TEST_F(Gpu, HeuristicCandidatesAllCompute) {
  auto engine = make_gemm_engine(DeviceKind::cuda);
  GemmDesc d;
  d.type = Dtype::bf16;
  d.m = d.n = d.k = 256;
  EXPECT_GE(engine->candidates(d, 4), 1);
}

TEST_F(Gpu, StreamKernelsMatchTheBodiesOnTheCpu) {
  Stream stream(DeviceKind::cuda);
  const int64_t n = 1 << 16;
  std::vector<double> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) a[i] = 0.5 * i, b[i] = 1.0 - i, c[i] = 0.25 * (i % 7);
  DeviceBuffer sink(DeviceKind::cuda, sizeof(double), "sink");
  for (auto k : {stream::Kernel::copy, stream::Kernel::scale, stream::Kernel::add,
                 stream::Kernel::triad, stream::Kernel::write}) {
    DeviceBuffer da(DeviceKind::cuda, n * 8, "a"), db(DeviceKind::cuda, n * 8, "b"),
        dc(DeviceKind::cuda, n * 8, "c");
    upload(a, da.data(), stream);
    upload(b, db.data(), stream);
    upload(c, dc.data(), stream);
    stream::run_device_passes(stream, k, da.as<double>(), db.as<double>(), dc.as<double>(), n, 1,
                              sink.as<double>());
    std::vector<double> ea = a, eb = b, ec = c;  // the CPU loop over the same bodies
    for (int64_t i = 0; i < n; ++i) {
      switch (k) {
        case stream::Kernel::copy: ec[i] = stream::copy(ea[i]); break;
        case stream::Kernel::scale: eb[i] = stream::scale(ec[i], stream::kScalar); break;
        case stream::Kernel::add: ec[i] = stream::add(ea[i], eb[i]); break;
        case stream::Kernel::triad: ea[i] = stream::triad(eb[i], ec[i], stream::kScalar); break;
        case stream::Kernel::write: ea[i] = stream::write(stream::kScalar); break;
        case stream::Kernel::read: break;
      }
    }
    EXPECT_EQ(download<double>(da.data(), n, stream), ea) << stream::to_string(k);
    EXPECT_EQ(download<double>(db.data(), n, stream), eb) << stream::to_string(k);
    EXPECT_EQ(download<double>(dc.data(), n, stream), ec) << stream::to_string(k);
  }
}

TEST_F(Gpu, DeviceArenaIsOneAlignedAllocation) {
  ArenaPlan plan;
  plan.add(10);
  plan.add(1000);
  DeviceArena arena(DeviceKind::cuda, "gpu arena", plan);
  for (size_t bytes : {10u, 1000u})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.take(bytes)) % 256, 0u);
}

TEST_F(Gpu, NcclCollectivesPassTheExactCheck) {
  std::string why;
  if (nccl_version(&why).empty()) GTEST_SKIP() << "NCCL: " << why;
  bench::CommBenchOptions o;
  o.device = DeviceKind::cuda;
  o.ops = {"all"};
  o.min_bytes = 1024;
  o.max_bytes = 1 << 20;
  o.factor = 32;
  o.iters = 2;
  o.warmup = 1;
  for (const char* dtype : {"f32", "bf16"}) {
    o.dtype = dtype;
    const auto result = bench::run_comm_bench_gpu(o, {});
    ASSERT_FALSE(result.points.empty());
    for (const auto& p : result.points) EXPECT_EQ(p.wrong, 0) << p.op << " " << p.bytes;
  }
}

// ZeRO-1's collectives on the device (parallel/distributed_optimizer.cpp):
// on one rank block 0 is all of it, and a reduce and a broadcast rooted
// there leave it as it is; offsets of the wrong count are refused.
TEST_F(Gpu, NcclBlockCollectivesOnOneRankKeepTheData) {
  std::string why;
  if (nccl_version(&why).empty()) GTEST_SKIP() << "NCCL: " << why;
  Stream stream(DeviceKind::cuda);
  DeviceCollectives nccl(0, 1, 0, {});
  const std::vector<float> values = random_values(1001, 7);
  DeviceBuffer data(DeviceKind::cuda, values.size() * sizeof(float), "blocks");
  upload(values, data.data(), stream);
  const std::vector<size_t> offsets = {0, values.size()};
  nccl.reduce_blocks(data.data(), offsets, Dtype::fp32, ReduceOp::sum, stream);
  nccl.broadcast_blocks(data.data(), offsets, Dtype::fp32, stream);
  EXPECT_EQ(download<float>(data.data(), values.size(), stream), values);
  const std::vector<size_t> three = {0, 10, values.size()};
  EXPECT_THROW(nccl.reduce_blocks(data.data(), three, Dtype::fp32, ReduceOp::sum, stream),
               InputError);
}

// Muon's grouped broadcasts on one rank leave the data as it is; a call
// NCCL refuses inside the group (a root past the ranks) throws and closes
// the group, so the next call still runs.
TEST_F(Gpu, NcclGroupedBroadcastsOnOneRankAndAFailedGroupCloses) {
  std::string why;
  if (nccl_version(&why).empty()) GTEST_SKIP() << "NCCL: " << why;
  Stream stream(DeviceKind::cuda);
  DeviceCollectives nccl(0, 1, 0, {});
  const std::vector<float> values = random_values(1001, 8);
  DeviceBuffer data(DeviceKind::cuda, values.size() * sizeof(float), "pieces");
  upload(values, data.data(), stream);
  const std::vector<DeviceCollectives::Piece> pieces = {{0, 300, 0}, {300, 1, 0}, {301, 700, 0}};
  nccl.broadcast_pieces(data.data(), pieces, Dtype::fp32, stream);
  EXPECT_EQ(download<float>(data.data(), values.size(), stream), values);
  const std::vector<DeviceCollectives::Piece> bad = {{0, 300, 0}, {300, 1, 5}};
  EXPECT_THROW(nccl.broadcast_pieces(data.data(), bad, Dtype::fp32, stream), SystemError);
  nccl.broadcast_pieces(data.data(), pieces, Dtype::fp32, stream);
  EXPECT_EQ(download<float>(data.data(), values.size(), stream), values);
}

}  // namespace
}  // namespace anvil::device
