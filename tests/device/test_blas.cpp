// The OpenBLAS core-type fix: the choice from CPUID, and that the loaded
// library really runs the kernels anvil asked for.
#include <gtest/gtest.h>

#include "anvil/device/blas.hpp"

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

}  // namespace
}  // namespace anvil::device
