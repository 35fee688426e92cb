// The OpenBLAS core-type fix: the choice from CPUID, and that the loaded
// library really runs the kernels anvil asked for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "anvil/base/cpu.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/tile_gemm.hpp"

namespace anvil::device {
namespace {

CpuFeatures avx512(bool bf16) {
  CpuFeatures f;
  f.avx = f.avx2 = f.fma = true;
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = true;
  f.avx512_bf16 = bf16;
  return f;
}

TEST(BlasCoretype, PicksCooperlakeForAvx512WithBf16) {
  EXPECT_EQ(choose_openblas_coretype(avx512(true)), "Cooperlake");
}

TEST(BlasCoretype, PicksSkylakeXForPlainAvx512) {
  EXPECT_EQ(choose_openblas_coretype(avx512(false)), "SkylakeX");
}

TEST(BlasCoretype, PicksHaswellForAvx2) {
  CpuFeatures f;
  f.avx = f.avx2 = f.fma = true;
  EXPECT_EQ(choose_openblas_coretype(f), "Haswell");
}

TEST(BlasCoretype, LeavesOlderCpusToTheLibrary) {
  EXPECT_EQ(choose_openblas_coretype(CpuFeatures{}), "");
}

TEST(BlasCoretype, PartialAvx512IsNotEnoughForSkylakeX) {
  CpuFeatures f = avx512(false);
  f.avx512bw = false;
  EXPECT_EQ(choose_openblas_coretype(f), "Haswell");
}

TEST(BlasLoader, LoadedLibraryRunsTheRequestedKernels) {
  const BlasInfo& info = blas_info();
  EXPECT_FALSE(info.library.empty());
  EXPECT_FALSE(info.corename.empty());
  EXPECT_FALSE(info.reason.empty());
  if (info.policy == "auto" && !info.requested.empty()) {
    EXPECT_EQ(info.corename, info.requested) << info.config;
  }
}

// Under ANVIL_ISA=avx2 (the CTest entries isa-avx2.*) every run-time choice
// is an AVX2-only CPU's, so a variant that did not take effect cannot pass;
// without it the features are the CPU's own.
TEST(IsaLimit, Avx2HoldsEveryRunTimeChoiceToAnAvx2Cpus) {
  const char* env = std::getenv("ANVIL_ISA");
  const CpuInfo& cpu = cpu_info();
  if (env == nullptr || std::string(env) != "avx2") {
    EXPECT_TRUE(cpu.isa_limit.empty());
    return;
  }
  EXPECT_EQ(cpu.isa_limit, "avx2");
  EXPECT_FALSE(cpu.features.avx512f);
  EXPECT_FALSE(cpu.features.avx512_bf16);
  EXPECT_FALSE(cpu.features.amx_tile);
  EXPECT_FALSE(bf16_native_available());
  EXPECT_EQ(bf16_path(), Bf16Path::emulated);
  EXPECT_FALSE(kernels::tile_gemm_bf16_available());
  EXPECT_EQ(onednn_cpu_isa(), "avx2");
  const BlasInfo& blas = blas_info();
  if (blas.policy == "auto" && !blas.requested.empty()) {
    EXPECT_EQ(blas.requested, "Haswell");
    EXPECT_EQ(blas.corename, "Haswell");
  }
}

}  // namespace
}  // namespace anvil::device
