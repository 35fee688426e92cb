// The BLAS library, loaded at run time so anvil can choose OpenBLAS's kernels.
//
// Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) picks its kernels from CPUID when it
// loads. On CPUs newer than it knows (e.g. Intel family 6 model 207) it falls
// back to "Prescott" and runs sgemm ~6x below the machine's FMA peak. The core
// type is read once, when the library is loaded, so anvil sets
// OPENBLAS_CORETYPE itself and only then dlopen()s the library: every anvil
// binary (CLI, tests, benchmarks) gets the right kernels with nothing set by
// the user, and child processes inherit the choice.
//
// ANVIL_BLAS_CORETYPE steers the choice:
//   auto (default)  anvil picks from CPUID (replacing an inherited OPENBLAS_CORETYPE)
//   library         OPENBLAS_CORETYPE removed: the library's own detection
//   env             keep OPENBLAS_CORETYPE as inherited
//   <name>          that core type, e.g. SkylakeX, Haswell
#pragma once

#include <cstdint>
#include <string>

#include "anvil/base/cpu.hpp"

namespace anvil::device {

struct BlasInfo {
  std::string library;    // file actually loaded (symlinks resolved)
  std::string config;     // openblas_get_config()
  std::string corename;   // openblas_get_corename(): the kernels in use
  std::string policy;     // auto | library | env | explicit
  std::string requested;  // OPENBLAS_CORETYPE anvil set ("" = none set)
  std::string inherited;  // OPENBLAS_CORETYPE found in the environment at start
  std::string reason;     // one sentence: why this core type
};

// The core type anvil picks for a CPU, or "" to leave the library's choice.
std::string choose_openblas_coretype(const CpuFeatures& features);

// Loads the library on first use (thread-safe) and describes it.
const BlasInfo& blas_info();

// Row-major single-precision GEMM straight from the library (no checks).
void blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc);

// Row-major C = alpha A A^T + beta C on the lower triangle of C [n, n] (A
// [n, k]; the upper triangle is not touched), straight from the library.
// False, with nothing done, when the library has no cblas_ssyrk.
bool blas_ssyrk_lower(int64_t n, int64_t k, float alpha, const float* a, int64_t lda, float beta,
                      float* c, int64_t ldc);

}  // namespace anvil::device
