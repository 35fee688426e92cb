// General matrix multiply, row-major, as BLAS defines it:
//   C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
// op(X) is X or X^T; lda/ldb/ldc are row strides in elements. With beta == 0
// C is not read (it may hold NaN). fp32 runs on OpenBLAS (with the core type
// fixed, see blas.hpp) or, for mid-sized shapes where it measured faster, on
// oneDNN; the choice depends on the shape only, so results are deterministic.
// bf16 inputs with fp32 accumulation and output run on oneDNN, which has
// AVX512_BF16 kernels and measured ~2x fp32 here.
#pragma once

#include <cstdint>
#include <string>

#include "anvil/base/bf16.hpp"

namespace anvil::kernels {

enum class GemmBackend {
  automatic,  // the fastest measured here: see prefer_onednn_f32; oneDNN for bf16
  openblas,   // fp32 only
  onednn,     // fp32 and bf16
  reference,  // naive triple loop with double accumulation: the test oracle
};

std::string to_string(GemmBackend backend);

// The automatic backend's fp32 rule: true where oneDNN measured faster.
bool prefer_onednn_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k);
// Throws InputError naming `flag` for an unknown name.
GemmBackend parse_gemm_backend(const std::string& name, const std::string& flag);

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend = GemmBackend::automatic);

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
          int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend = GemmBackend::automatic);

}  // namespace anvil::kernels
