// The tile kernel: for each [kRows x kVecs vectors] block of C the
// accumulators stay in registers over the whole k loop; each k loads kVecs
// vectors of B's row k and broadcasts kRows elements of A's column k
// (kRows * kVecs FMAs per kVecs + kRows loads). Column blocks run outermost
// so a B panel (k x kVecs vectors) stays in L1 while every row block passes
// over it. The edges (fewer rows, fewer vectors) are the same template
// instantiated smaller.
#include "anvil/kernels/tile_gemm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <utility>

namespace anvil::kernels {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kRows = 6, kVecs = 4;  // 24 accumulators of 32 registers
using Vec = __m512;
inline Vec load(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void store(float* p, Vec v) {
  _mm512_storeu_ps(p, v);
}
inline Vec splat(float x) {
  return _mm512_set1_ps(x);
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline Vec mul(Vec a, Vec b) {
  return _mm512_mul_ps(a, b);
}
inline Vec add(Vec a, Vec b) {
  return _mm512_add_ps(a, b);
}
inline Vec zero() {
  return _mm512_setzero_ps();
}
constexpr const char* kDescription = "AVX-512, 6 x 64 register tile";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
constexpr int kRows = 6, kVecs = 2;  // 12 accumulators of 16 registers
using Vec = __m256;
inline Vec load(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void store(float* p, Vec v) {
  _mm256_storeu_ps(p, v);
}
inline Vec splat(float x) {
  return _mm256_set1_ps(x);
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline Vec mul(Vec a, Vec b) {
  return _mm256_mul_ps(a, b);
}
inline Vec add(Vec a, Vec b) {
  return _mm256_add_ps(a, b);
}
inline Vec zero() {
  return _mm256_setzero_ps();
}
constexpr const char* kDescription = "AVX2, 6 x 16 register tile";
#else
constexpr int kLanes = 0;
constexpr const char* kDescription = "none";
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

template <int R, int V>
void block(int64_t k, float alpha, bool accumulate, const float* a, int64_t a_row, int64_t a_col,
           const float* b, int64_t ldb, float* c, int64_t ldc) {
  Vec acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = zero();
  for (int64_t p = 0; p < k; ++p) {
    Vec bv[V];
    const float* brow = b + p * ldb;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = load(brow + v * kLanes);
    const float* acol = a + p * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec av = splat(acol[r * a_row]);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] = fma(av, bv[v], acc[r][v]);
    }
  }
  const Vec scale = splat(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + v * kLanes;
      Vec x = alpha == 1.0f ? acc[r][v] : mul(acc[r][v], scale);
      if (accumulate) x = add(x, load(out));
      store(out, x);
    }
  }
}

using Block = void (*)(int64_t, float, bool, const float*, int64_t, int64_t, const float*, int64_t,
                       float*, int64_t);

template <int R, int... Vs>
constexpr std::array<Block, kVecs> blocks_of_rows(std::integer_sequence<int, Vs...>) {
  return {&block<R, Vs + 1>...};
}

// kBlocks[r - 1][v - 1] = block<r, v>: the full block and every edge.
template <int... Rs>
constexpr std::array<std::array<Block, kVecs>, kRows> all_blocks(
    std::integer_sequence<int, Rs...>) {
  return {blocks_of_rows<Rs + 1>(std::make_integer_sequence<int, kVecs>{})...};
}

constexpr auto kBlocks = all_blocks(std::make_integer_sequence<int, kRows>{});

#endif

}  // namespace

int tile_gemm_lanes() {
  return kLanes;
}

const char* tile_gemm_description() {
  return kDescription;
}

void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, bool accumulate, const float* a,
               int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c, int64_t ldc) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  constexpr int64_t kPanel = kVecs * kLanes;
  for (int64_t j = 0; j < n; j += kPanel) {
    const auto vecs = static_cast<int>(std::min<int64_t>(kPanel, n - j) / kLanes);
    for (int64_t i = 0; i < m; i += kRows) {
      const auto rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      kBlocks[static_cast<size_t>(rows - 1)][static_cast<size_t>(vecs - 1)](
          k, alpha, accumulate, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j, ldc);
    }
  }
#else
  (void)m, (void)n, (void)k, (void)alpha, (void)accumulate, (void)a, (void)a_row, (void)a_col,
      (void)b, (void)ldb, (void)c, (void)ldc;
  throw std::logic_error("tile_gemm: this build has no tile kernel (tile_gemm_lanes() == 0)");
#endif
}

namespace {

void transpose_scalar(float* bt, int64_t ldt, const float* rows, int64_t stride, int64_t j0,
                      int64_t j1, int64_t d0, int64_t d1) {
  for (int64_t d = d0; d < d1; ++d)
    for (int64_t j = j0; j < j1; ++j) bt[d * ldt + j] = rows[j * stride + d];
}

}  // namespace

void tile_transpose(float* bt, int64_t ldt, const float* rows, int64_t stride, int64_t n,
                    int64_t D) {
#if defined(__AVX2__)
  const int64_t n8 = n / 8 * 8, d8 = D / 8 * 8;
  for (int64_t j = 0; j < n8; j += 8) {
    for (int64_t d = 0; d < d8; d += 8) {
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + (j + i) * stride + d);
      for (int i = 0; i < 8; i += 2) {  // interleave row pairs
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {  // then pairs of pairs: 4-row columns per 128-bit lane
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int i = 0; i < 4; ++i) {  // rows 0-3 and 4-7 of each column joined across lanes
        _mm256_storeu_ps(bt + (d + i) * ldt + j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(bt + (d + i + 4) * ldt + j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
    transpose_scalar(bt, ldt, rows, stride, j, j + 8, d8, D);
  }
  transpose_scalar(bt, ldt, rows, stride, n8, n, 0, D);
#else
  transpose_scalar(bt, ldt, rows, stride, 0, n, 0, D);
#endif
}

}  // namespace anvil::kernels
