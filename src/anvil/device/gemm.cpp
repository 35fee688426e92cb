#include "anvil/device/gemm.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "anvil/base/cpu.hpp"
#include "anvil/base/env_choice.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/step_parts.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm_onednn.hpp"

namespace anvil::device {
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

// The emulated bf16 path: bf16 -> fp32 is exact, so widening the operands and
// running the fp32 GEMM multiplies exactly the values the native path does.
// Operands are widened a block of C at a time into per-thread buffers of at
// most kBlockElems floats each, so the extra memory stays bounded (2 x 16 MiB)
// whatever the shape.
constexpr int64_t kBlockElems = int64_t{1} << 22;

// Widens rows [r0, r0 + rows) x cols [c0, c0 + cols) of a row-major bf16
// matrix with row stride ld into dst (contiguous, row stride cols).
void widen(const bf16* src, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
           float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols > (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* s = src + (r0 + r) * ld + c0;
    float* d = dst + r * cols;
    for (int64_t c = 0; c < cols; ++c) d[c] = to_float(s[c]);
  }
}

void emulated_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c,
                   int64_t ldc, GemmBackend inner = GemmBackend::automatic) {
  detail::gemm_bf16_emulated(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                             kBlockElems, inner);
}

}  // namespace

void detail::gemm_bf16_emulated(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const bf16* a, int64_t lda, const bf16* b, int64_t ldb,
                                float beta, float* c, int64_t ldc, int64_t block_elems,
                                GemmBackend inner) {
  check_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  const StepPartScope part(StepPart::gemm);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) return scale_c(m, n, beta, c, ldc);
  thread_local std::vector<float> wa, wb;
  // Rows of C per block (all of op(A) when it fits) and columns likewise; at
  // least 16 so a very long k still makes GEMMs, not dot products.
  const int64_t bm = std::min(m, std::max<int64_t>(16, block_elems / k));
  const int64_t bn = std::min(n, std::max<int64_t>(16, block_elems / k));
  wa.resize(static_cast<size_t>(bm * k));
  wb.resize(static_cast<size_t>(bn * k));
  for (int64_t i0 = 0; i0 < m; i0 += bm) {
    const int64_t mi = std::min(bm, m - i0);
    // op(A) rows [i0, i0 + mi): stored rows when not transposed, columns when transposed.
    if (trans_a) {
      widen(a, lda, 0, k, i0, mi, wa.data());
    } else {
      widen(a, lda, i0, mi, 0, k, wa.data());
    }
    for (int64_t j0 = 0; j0 < n; j0 += bn) {
      const int64_t nj = std::min(bn, n - j0);
      if (trans_b) {
        widen(b, ldb, j0, nj, 0, k, wb.data());
      } else {
        widen(b, ldb, 0, k, j0, nj, wb.data());
      }
      gemm(trans_a, trans_b, mi, nj, k, alpha, wa.data(), trans_a ? mi : k, wb.data(),
           trans_b ? k : nj, beta, c + i0 * ldc + j0, ldc, inner);
    }
  }
}

bool bf16_native_available() {
  return cpu_info().features.avx512_bf16;
}

Bf16Path bf16_path() {
  static const Bf16Path path = [] {
    const std::string want = env_choice("ANVIL_BF16", {"auto", "native", "emulated"});
    if (want == "emulated") return Bf16Path::emulated;
    if (want == "native") {
      if (!bf16_native_available())
        throw InputError(cpu_info().isa_limit.empty()
                             ? "ANVIL_BF16=native: this CPU has no AVX512_BF16 (expected auto or "
                               "emulated)"
                             : "ANVIL_BF16=native: ANVIL_ISA=" + cpu_info().isa_limit +
                                   " hides AVX512_BF16 (expected auto or emulated with it)");
      return Bf16Path::native;
    }
    return bf16_native_available() ? Bf16Path::native : Bf16Path::emulated;
  }();
  return path;
}

std::string bf16_path_description(Bf16Path path) {
  if (path != Bf16Path::native) return "emulated (bf16 widened to fp32, then the fp32 GEMM)";
  // oneDNN picks its kernels from the ISA it may use: on a CPU with AMX (and
  // the kernel's permission for its tile state) its matmuls run on the tiles
  // (brg:avx512_core_amx_bf16 in ONEDNN_VERBOSE), else on AVX512_BF16.
  return onednn_cpu_isa() == "avx512_core_amx" ? "native AMX tiles (oneDNN avx512_core_amx)"
                                               : "native AVX512_BF16 (oneDNN)";
}

bool prefer_onednn_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  // Measured on 2-core AMD EPYC Zen 3, 4 and 5 VMs (docs/kernels.md, `anvil bench gemm
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
    case GemmBackend::emulated:
      return "emulated";
    case GemmBackend::segments:
      return "segments";
  }
  return "?";
}

GemmBackend parse_gemm_backend(const std::string& name, const std::string& flag) {
  for (auto b : {GemmBackend::automatic, GemmBackend::openblas, GemmBackend::onednn,
                 GemmBackend::reference, GemmBackend::emulated}) {
    if (to_string(b) == name) return b;
  }
  throw InputError(flag + ": unknown GEMM backend '" + name +
                   "' (expected auto, openblas, onednn, reference or emulated)");
}

namespace {

// c[j] = alpha * dot(b[j, 0..k), a) + beta * c[j]: one row of A against a
// weight stored [n, k] (a linear layer at batch 1, a decode step). It streams
// the weights once, four rows at a time with a vector sum each, the rows
// split over the threads; OpenBLAS's and oneDNN's m = 1 paths read them at
// a third to two thirds of the memory bandwidth (docs/kernels.md).
void gemv_rows(int64_t n, int64_t k, float alpha, const float* a, const float* b, int64_t ldb,
               float beta, float* c) {
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 16))
  for (int64_t q = 0; q < blocks; ++q) {
    const int64_t j0 = 4 * q, nj = std::min<int64_t>(4, n - j0);
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (nj == 4) {
      const float *b0 = b + j0 * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t i = 0; i < k; ++i) {
        s0 += b0[i] * a[i];
        s1 += b1[i] * a[i];
        s2 += b2[i] * a[i];
        s3 += b3[i] * a[i];
      }
      s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
    } else {
      for (int64_t r = 0; r < nj; ++r) {
        const float* br = b + (j0 + r) * ldb;
        float sr = 0.0f;
#pragma omp simd reduction(+ : sr)
        for (int64_t i = 0; i < k; ++i) sr += br[i] * a[i];
        s[r] = sr;
      }
    }
    for (int64_t r = 0; r < nj; ++r)
      c[j0 + r] = alpha * s[r] + (beta == 0.0f ? 0.0f : beta * c[j0 + r]);
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend) {
  check_args(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  const StepPartScope part(StepPart::gemm);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) return scale_c(m, n, beta, c, ldc);
  switch (backend) {
    case GemmBackend::automatic:
    case GemmBackend::emulated:
      // One row against weights stored [n, k]: the weights streamed once.
      if (m == 1 && trans_b && !trans_a) return gemv_rows(n, k, alpha, a, b, ldb, beta, c);
      if (prefer_onednn_f32(trans_a, trans_b, m, n, k)) {
        return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      }
      return blas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::segments:
      if (m == 1 && trans_b && !trans_a)  // an expert's one token (decode)
        return gemv_rows(n, k, alpha, a, b, ldb, beta, c);
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
  const StepPartScope part(StepPart::gemm);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) return scale_c(m, n, beta, c, ldc);
  switch (backend) {
    case GemmBackend::automatic:
      if (bf16_path() == Bf16Path::emulated) {
        return emulated_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      }
      return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::onednn:
      if (!bf16_native_available())
        throw std::invalid_argument(
            "gemm: oneDNN's bf16 GEMM needs AVX512_BF16, which this CPU lacks");
      return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::emulated:
      return emulated_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case GemmBackend::segments:
      if (bf16_path() == Bf16Path::native) {
        return detail::onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                                   /*any_rows=*/true);
      }
      [[fallthrough]];
    case GemmBackend::openblas:  // Debian's OpenBLAS has no bf16 GEMM: widened for its sgemm
      return emulated_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                           GemmBackend::openblas);
    case GemmBackend::reference:
      return reference(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace anvil::device
