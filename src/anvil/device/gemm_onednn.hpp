// oneDNN matmul behind the gemm() signature. Primitives are created once per
// (dtype, layout, shape, alpha, beta) and cached: creating one costs far more
// than running a small GEMM. any_rows leaves the token dimension (m, or k when
// A is transposed) to run time: one primitive for every row count, for GEMMs
// whose row count changes every call. Internal to kernels/.
#pragma once

#include <cstdint>

#include "anvil/base/bf16.hpp"

namespace anvil::device::detail {

void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc);
void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c,
                 int64_t ldc, bool any_rows = false);

}  // namespace anvil::device::detail
