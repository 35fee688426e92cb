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
#include <cstring>
#include <stdexcept>
#include <utility>

#include "anvil/base/cpu.hpp"

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

#if defined(__AVX512BF16__)
constexpr int kPairRows = 6, kPairVecs = 4;

template <int R, int V>
void block_bf16(int64_t kp, float alpha, bool accumulate, const uint32_t* a, int64_t a_row,
                int64_t a_col, const uint32_t* b, int64_t ldb, float* c, int64_t ldc) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[V];
    const uint32_t* brow = b + p * ldb;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(brow + v * 16);
    const uint32_t* acol = a + p * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(acol[r * a_row]));
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + v * 16;
      __m512 x = alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(acc[r][v], scale);
      if (accumulate) x = _mm512_add_ps(x, _mm512_loadu_ps(out));
      _mm512_storeu_ps(out, x);
    }
  }
}

using PairBlock = void (*)(int64_t, float, bool, const uint32_t*, int64_t, int64_t, const uint32_t*,
                           int64_t, float*, int64_t);

template <int R, int... Vs>
constexpr std::array<PairBlock, kPairVecs> pair_blocks_of_rows(std::integer_sequence<int, Vs...>) {
  return {&block_bf16<R, Vs + 1>...};
}

template <int... Rs>
constexpr std::array<std::array<PairBlock, kPairVecs>, kPairRows> all_pair_blocks(
    std::integer_sequence<int, Rs...>) {
  return {pair_blocks_of_rows<Rs + 1>(std::make_integer_sequence<int, kPairVecs>{})...};
}

constexpr auto kPairBlocks = all_pair_blocks(std::make_integer_sequence<int, kPairRows>{});
#endif

inline uint32_t bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(to_bf16(lo).bits) | static_cast<uint32_t>(to_bf16(hi).bits) << 16;
}

}  // namespace

bool tile_gemm_bf16_available() {
#if defined(__AVX512BF16__)
  static const bool on = cpu_info().features.avx512_bf16;
  return on;
#else
  return false;
#endif
}

void tile_gemm_bf16(int64_t m, int64_t n, int64_t kp, float alpha, bool accumulate,
                    const uint32_t* a, int64_t a_row, int64_t a_col, const uint32_t* b, int64_t ldb,
                    float* c, int64_t ldc) {
#if defined(__AVX512BF16__)
  constexpr int64_t kPanel = kPairVecs * 16;
  for (int64_t j = 0; j < n; j += kPanel) {
    const auto vecs = static_cast<int>(std::min<int64_t>(kPanel, n - j) / 16);
    for (int64_t i = 0; i < m; i += kPairRows) {
      const auto rows = static_cast<int>(std::min<int64_t>(kPairRows, m - i));
      kPairBlocks[static_cast<size_t>(rows - 1)][static_cast<size_t>(vecs - 1)](
          kp, alpha, accumulate, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j, ldc);
    }
  }
#else
  (void)m, (void)n, (void)kp, (void)alpha, (void)accumulate, (void)a, (void)a_row, (void)a_col,
      (void)b, (void)ldb, (void)c, (void)ldc;
  throw std::logic_error("tile_gemm_bf16: this build has no AVX512_BF16 tile kernel");
#endif
}

void bf16_pairs_along_rows(uint32_t* out, int64_t ld, const float* x, int64_t stride, int64_t n,
                           int64_t cols) {
  // A row's pairs are its bf16 values in order (little-endian: the lower k low).
  for (int64_t i = 0; i < n; ++i)
    to_bf16(reinterpret_cast<bf16*>(out + i * ld), x + i * stride, cols);
}

void bf16_pairs_across_rows(uint32_t* out, int64_t ld, const float* x, int64_t stride, int64_t n,
                            int64_t cols) {
  for (int64_t p = 0; 2 * p < n; ++p) {
    const float* lo = x + 2 * p * stride;
    const float* hi = 2 * p + 1 < n ? lo + stride : nullptr;
    uint32_t* o = out + p * ld;
    int64_t j = 0;
#if defined(__AVX512BF16__)
    // Both rows' 16 values rounded into one register (lo's in the low half),
    // then interleaved: element 2j from lo's j, 2j + 1 from hi's j.
    const __m512i interleave =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (; j + 16 <= cols; j += 16) {
      const __m512 h = hi == nullptr ? _mm512_setzero_ps() : _mm512_loadu_ps(hi + j);
      const __m512 l = _mm512_loadu_ps(lo + j);
      if ((subnormal_lanes(h) | subnormal_lanes(l)) != 0) {  // the scalar rounding's bits
        for (int64_t jj = j; jj < j + 16; ++jj)
          o[jj] = bf16_pair(lo[jj], hi == nullptr ? 0.0f : hi[jj]);
        continue;
      }
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(h, l);
      _mm512_storeu_si512(o + j, _mm512_maskz_permutexvar_epi16(~__mmask32{0}, interleave, both));
    }
#endif
    for (; j < cols; ++j) o[j] = bf16_pair(lo[j], hi == nullptr ? 0.0f : hi[j]);
  }
}

namespace {

// 32-bit elements (floats, or bf16 pairs) transposed as bits: vector
// shuffles and 4-byte copies, no arithmetic.
void transpose_scalar(void* bt, int64_t ldt, const void* rows, int64_t stride, int64_t j0,
                      int64_t j1, int64_t d0, int64_t d1) {
  auto* out = static_cast<char*>(bt);
  const auto* in = static_cast<const char*>(rows);
  for (int64_t d = d0; d < d1; ++d)
    for (int64_t j = j0; j < j1; ++j)
      std::memcpy(out + 4 * (d * ldt + j), in + 4 * (j * stride + d), 4);
}

void transpose32(void* bt_bytes, int64_t ldt, const void* rows_bytes, int64_t stride, int64_t n,
                 int64_t D) {
#if defined(__AVX2__)
  auto* bt = static_cast<char*>(bt_bytes);
  const auto* rows = static_cast<const char*>(rows_bytes);
  auto load = [&](int64_t j, int64_t d) {
    return _mm256_castsi256_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + 4 * (j * stride + d))));
  };
  auto store = [&](int64_t d, int64_t j, __m256 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bt + 4 * (d * ldt + j)), _mm256_castps_si256(v));
  };
  const int64_t n8 = n / 8 * 8, d8 = D / 8 * 8;
  for (int64_t j = 0; j < n8; j += 8) {
    for (int64_t i = j + kRowsAhead; i < std::min(n, j + kRowsAhead + 8); ++i)
      prefetch_row(rows + 4 * i * stride, 4 * D);
    for (int64_t d = 0; d < d8; d += 8) {
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = load(j + i, d);
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
        store(d + i, j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        store(d + i + 4, j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
    transpose_scalar(bt_bytes, ldt, rows_bytes, stride, j, j + 8, d8, D);
  }
  transpose_scalar(bt_bytes, ldt, rows_bytes, stride, n8, n, 0, D);
#else
  transpose_scalar(bt_bytes, ldt, rows_bytes, stride, 0, n, 0, D);
#endif
}

}  // namespace

void tile_transpose(float* bt, int64_t ldt, const float* rows, int64_t stride, int64_t n,
                    int64_t D) {
  transpose32(bt, ldt, rows, stride, n, D);
}

void bf16_pairs_transposed(uint32_t* bt, int64_t ldt, const float* rows, int64_t stride, int64_t n,
                           int64_t D, uint32_t* scratch) {
  bf16_pairs_along_rows(scratch, D / 2, rows, stride, n, D);
  transpose32(bt, ldt, scratch, D / 2, n, D / 2);
}

}  // namespace anvil::kernels
