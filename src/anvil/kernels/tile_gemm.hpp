// A register-blocked GEMM for the small tiles inside attention: C [M x N] =
// alpha * A B (+ C), where B's rows hold N contiguous floats and A is read
// one element at a time through two strides (so A^T costs nothing). No
// packing and no per-call setup: the caller lays B out (a transposed key
// tile, a value tile) once and multiplies many row strips against it, each a
// few microseconds long, where a BLAS call's packing and dispatch would
// cost as much as the product. Built for AVX-512 (16 lanes, 6 x 64 tiles)
// or AVX2 + FMA (8 lanes, 6 x 16), whichever the build targets; neither:
// tile_gemm_lanes() is 0 and callers use the BLAS tiles.
#pragma once

#include <cstdint>

#include "anvil/base/bf16.hpp"

namespace anvil::kernels {

// Floats per vector of the build's tile kernel; 0 when it has none.
int tile_gemm_lanes();
// "AVX-512, 6 x 64 register tile" or "none" (for `anvil hw`).
const char* tile_gemm_description();

// C(i, :) = alpha * sum_k A(i, k) B(k, :) (+ C(i, :) when accumulate), for
// i < m and the first n columns, with A(i, k) = a[i * a_row + k * a_col],
// B(k, :) = b + k * ldb, C(i, :) = c + i * ldc. n must be a multiple of
// tile_gemm_lanes(); k may be 0 (C = 0, or left as it is when accumulating).
void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, bool accumulate, const float* a,
               int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c, int64_t ldc);

// Rows of a packed activation (qkv, the attention output and their
// gradients) lie a whole token's width apart (6 KiB for 8 + 2 x 8 heads of
// 64), a stride the hardware prefetchers do not follow: a loop over them
// stalls on every row. Loops that read or write such rows first ask for the
// row kRowsAhead ahead: `bytes` from `row`, a cache line at a time. In
// attention's transposes, gathers, row deltas and stores (AVX-512 Zen 5,
// 2026-12-07, `anvil bench attention`, 4 interleaved rounds, medians of the
// % of the sgemm peak): T = 256 49.0% -> 52.7% (D = 64), 52.2% -> 56.2%
// (128); 4 and 16 rows ahead measured no better than 8.
inline constexpr int64_t kRowsAhead = 8;
inline void prefetch_row(const void* row, int64_t bytes, bool for_write = false) {
  const auto* p = static_cast<const char*>(row);
  for (int64_t o = 0; o < bytes; o += 64) {
    if (for_write) {
      __builtin_prefetch(p + o, 1);
    } else {
      __builtin_prefetch(p + o, 0);
    }
  }
}

// bt[d * ldt + j] = rows[j * stride + d] for j < n, d < D: a block of rows
// (keys, values) transposed for the B side of tile_gemm, in 8 x 8 blocks of
// AVX registers (scalar at the edges; all scalar without a tile kernel).
void tile_transpose(float* bt, int64_t ldt, const float* rows, int64_t stride, int64_t n,
                    int64_t D);

// ---- bf16 products on AVX512_BF16 (VDPBF16PS) ----
// A pair is two bf16 of consecutive k in one 32-bit word, the lower k in
// the low half. The kernel is tile_gemm's with pairs for elements: a 6 x 64
// block of C in registers; per pair of k, 4 loads of B's pairs, 6 broadcasts
// of A's, 24 VDPBF16PS (each adds both products of a pair to an fp32 sum).

// Whether the build has the kernel and this CPU runs it.
bool tile_gemm_bf16_available();

// C(i, :) = alpha * sum_p A(i, p) . B(p, :) (+ C(i, :) when accumulate) for
// i < m and the first n columns (n a multiple of 16), with A(i, p) =
// a[i * a_row + p * a_col] the pair of k = 2p, 2p + 1 of row i and B(p, j)
// = b[p * ldb + j] the pair of column j. kp pairs; fp32 sums.
void tile_gemm_bf16(int64_t m, int64_t n, int64_t kp, float alpha, bool accumulate,
                    const uint32_t* a, int64_t a_row, int64_t a_col, const uint32_t* b, int64_t ldb,
                    float* c, int64_t ldc);

// Pairs along rows: out[i * ld + p] = (x[i][2p], x[i][2p + 1]) rounded to
// bf16, for i < n rows (`stride` floats apart) and cols (even) columns.
void bf16_pairs_along_rows(uint32_t* out, int64_t ld, const float* x, int64_t stride, int64_t n,
                           int64_t cols);
// Pairs across rows: out[p * ld + j] = (x[2p][j], x[2p + 1][j]) rounded to
// bf16, for p < ceil(n / 2) and j < cols; an odd n's missing row is zero.
void bf16_pairs_across_rows(uint32_t* out, int64_t ld, const float* x, int64_t stride, int64_t n,
                            int64_t cols);
// Pairs along rows, transposed: bt[p * ldt + j] = (rows[j][2p], rows[j][2p + 1])
// for j < n rows and p < D/2 (D even), through `scratch` (n * D / 2 pairs):
// the B side of a product against the rows' transpose (Q K^T's K).
void bf16_pairs_transposed(uint32_t* bt, int64_t ldt, const float* rows, int64_t stride, int64_t n,
                           int64_t D, uint32_t* scratch);

}  // namespace anvil::kernels
