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

// bt[d * ldt + j] = rows[j * stride + d] for j < n, d < D: a block of rows
// (keys, values) transposed for the B side of tile_gemm, in 8 x 8 blocks of
// AVX registers (scalar at the edges; all scalar without a tile kernel).
void tile_transpose(float* bt, int64_t ldt, const float* rows, int64_t stride, int64_t n,
                    int64_t D);

}  // namespace anvil::kernels
