#include "anvil/kernels/gemm.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "anvil/base/error.hpp"
#include "anvil/kernels/blas.hpp"
#include "anvil/kernels/gemm_onednn.hpp"

namespace anvil::kernels {
namespace {

void check_args(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                int64_t ldb, int64_t ldc) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("gemm: " + what); };
  if (m < 0 || n < 0 || k < 0) fail("m, n, k must be >= 0");
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) fail("m, n, k must fit in 32 bits (BLAS int)");
  if (lda < std::max<int64_t>(1, trans_a ? m : k)) fail("lda too small for op(A)");
  if (ldb < std::max<int64_t>(1, trans_b ? k : n)) fail("ldb too small for op(B)");
  if (ldc < std::max<int64_t>(1, n)) fail("ldc too small for C");
  if (lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    fail("leading dimensions must fit in 32 bits");
}

inline float load(const float* p) {
  return *p;
}
inline float load(const bf16* p) {
  return to_float(*p);
}

// The oracle: obvious loops, double accumulation, BLAS beta semantics.
template <typename T>
void reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = load(trans_a ? a + p * lda + i : a + i * lda + p);
        const float bv = load(trans_b ? b + j * ldb + p : b + p * ldb + j);
        acc += static_cast<double>(av) * bv;
      }
      float& out = c[i * ldc + j];
      out =
          static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * out));
    }
  }
}

// k == 0 (or alpha == 0): C = beta * C, never reading C when beta == 0.
void scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
  }
}

}  // namespace

bool prefer_onednn_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  // Measured on this project's machines (docs/kernels.md, `anvil bench gemm
  // --baselines openblas,onednn`): oneDNN's brgemm is 1.2-1.5x faster than
  // OpenBLAS on mid-sized GEMMs, where OpenBLAS's threading overhead shows;
  // below ~2*100^3 FLOPs OpenBLAS runs single-threaded and oneDNN's fixed
  // cost dominates; above ~1 GFLOP OpenBLAS is as fast or faster. Weight
  // gradients (A^T B) with a long reduction stay on OpenBLAS, which wins there.
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (flops < 2e6 || flops > 1.1e9) return false;
  if (trans_a && !trans_b && k >= 4 * std::max(m, n)) return false;
  return true;
}

std::string to_string(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::automatic:
      return "auto";
    case GemmBackend::openblas:
      return "openblas";
    case GemmBackend::onednn:
      return "onednn";
    case GemmBackend::reference:
      return "reference";
  }
  return "?";
}

GemmBackend parse_gemm_backend(const std::string& name, const std::string& flag) {
  for (auto b : {GemmBackend::automatic, GemmBackend::openblas, GemmBackend::onednn,
                 GemmBackend::reference}) {
    if (to_string(b) == name) return b;
  }
  throw InputError(flag + ": unknown GEMM backend '" + name +
                   "' (expected auto, openblas, onednn or reference)");
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend) {
  check_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) return scale_c(m, n, beta, c, ldc);
  switch (backend) {
    case GemmBackend::automatic:
      if (prefer_onednn_f32(trans_a, trans_b, m, n, k)) {
        return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      }
      return blas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::openblas:
      return blas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::onednn:
      return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::reference:
      return reference(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
          int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend) {
  check_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) return scale_c(m, n, beta, c, ldc);
  switch (backend) {
    case GemmBackend::automatic:
    case GemmBackend::onednn:
      return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::openblas:
      throw std::invalid_argument("gemm: the openblas backend has no bf16 GEMM in Debian's build");
    case GemmBackend::reference:
      return reference(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace anvil::kernels
