// Causal multi-head / grouped-query attention on the CPU, flash-attention
// style: the forward keeps only the output and the per-row log-sum-exp, and
// the backward recomputes the probabilities from them; memory is O(block^2)
// per thread, never O(T^2). Training's forward and backward work on
// [kBlock x D] query/key tiles whose products are GEMM calls (the BLAS
// kernels, single-threaded inside the parallel tasks), so attention runs at
// GEMM speed. Decode (one query row) keeps the vector path: each key/value
// tile transposed once to [D][kTile] so a row's scores are kTile-wide FMAs.
// See layers.hpp for layouts.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "anvil/base/cpu.hpp"
#include "anvil/base/env_choice.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/step_parts.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/fast_math.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/tile_gemm.hpp"

namespace anvil::kernels {
namespace {

constexpr int64_t kTile = 64;

// dst[d * kTile + j] = src[j * stride + d] for the n <= kTile rows of a tile;
// columns past n are zero.
void transpose_tile(float* dst, const float* src, int64_t stride, int64_t n, int64_t D) {
  tile_transpose(dst, kTile, src, stride, n, D);
  for (int64_t d = 0; d < D; ++d) std::fill(dst + d * kTile + n, dst + (d + 1) * kTile, 0.0f);
}

// s[j] = scale * sum_d q[d] kt[d][j] for the whole tile.
inline void tile_scores(float* s, const float* q, const float* kt, int64_t D, float scale) {
  float acc[kTile] = {};
  for (int64_t d = 0; d < D; ++d) {
    const float qd = q[d];
    const float* row = kt + d * kTile;
#pragma omp simd
    for (int64_t j = 0; j < kTile; ++j) acc[j] += qd * row[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < kTile; ++j) s[j] = acc[j] * scale;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Folds keys [j0, j0 + n) of one tile into one query row's running softmax
// state (running max m, running sum l, unnormalised output o).
inline void online_softmax_tile(float* o, float* m, float* l, const float* scores, const float* v,
                                int64_t v_stride, int64_t n, int64_t D) {
  float tile_max = *m;
  for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, scores[j]);
  const float correction = fast_exp(*m - tile_max);
  float sum = *l * correction;
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) o[i] *= correction;
  for (int64_t j = 0; j < n; ++j) {
    const float p = fast_exp(scores[j] - tile_max);
    sum += p;
    axpy(o, p, v + j * v_stride, D);
  }
  *m = tile_max;
  *l = sum;
}

}  // namespace

namespace {

// Query and key blocks of the GEMM path: a (batch, head) task multiplies
// [kBlock x D] tiles, large enough for the tile products to run near their
// peak, small enough that a block's scores stay in L2.
constexpr int64_t kBlock = 128;
// The BLAS tiles' GEMM library (single-threaded inside the tasks).
constexpr device::GemmBackend kTileGemm = device::GemmBackend::openblas;

// A query block and a key block meet in one of two ways: every query sees
// every key (a full block, kFull), or the block holds the query's own
// position and the keys after it are masked. `off` is then the query
// block's first global position minus the key block's: query row i sees
// keys 0 .. i + off (off = 0: aligned blocks, row r sees keys 0..r).
constexpr int64_t kFull = std::numeric_limits<int64_t>::max() / 4;

// Rows of a masked block pair see only the keys up to their own: strips of
// rows multiply only the key columns some row of the strip needs, so the
// tiles above the diagonal are skipped (at T = 256 the 128-row blocks would
// otherwise do 1.5x the useful work).
// - The tile kernel: 12-row strips, two whole 6-row register blocks each.
//   They do 1.08x the useful work of a masked 128 x 128 pair in A B and
//   1.17x in A B^T (columns rounded up to whole vectors), against 1.12x
//   for 16-row strips, whose third register block has 4 rows and takes
//   about as long as a full one. AVX-512 Zen 5, 2026-12-06, `anvil bench
//   attention`, the two heights interleaved over 5 rounds, medians of the
//   % of the sgemm peak: T = 256 47.7% against 45.3% (D = 64), 51.6%
//   against 47.2% (128). A height 12 does not divide (128 = 8 + 10 x 12)
//   leaves its short strip first, where its rows see the fewest keys and
//   its partial register block multiplies a vector of keys, not eight.
//   The kernel sums each product over k in order, so the strips add or
//   skip only exact zero terms: the same bits as any other height.
// - The BLAS tiles: 16-row strips, the short one last. OpenBLAS's sums
//   depend on k, so other strips change the bits (the recorded golden runs
//   pin these).
struct Strips {
  int64_t rows;
  bool short_first;
};

// Calls f(r0, r1, kend) for row strips [r0, r1) of a block pair and the keys
// [0, kend) they need: one strip where every row sees every key, strips of
// st.rows rows otherwise.
template <class F>
void for_each_row_strip(Strips st, int64_t mq, int64_t nk, int64_t off, F&& f) {
  if (off + 1 >= nk) {
    f(int64_t{0}, mq, nk);
    return;
  }
  const int64_t rest = mq % st.rows;
  int64_t r0 = 0;
  for (int64_t r1 = st.short_first && rest != 0 ? rest : st.rows; r0 < mq; r1 += st.rows) {
    r1 = std::min(r1, mq);
    f(r0, r1, std::min(nk, r1 + off));
    r0 = r1;
  }
}

// The transposed products (dV, dK: one row per key): calls f(c0, c1, first)
// for key strips [c0, c1) and the first query row that sees them (rows
// [first, mq) do). The short strip is the last, whose keys the fewest rows see.
template <class F>
void for_each_key_strip(Strips st, int64_t nk, int64_t off, F&& f) {
  if (off + 1 >= nk) {
    f(int64_t{0}, nk, int64_t{0});
    return;
  }
  for (int64_t c0 = 0; c0 < nk; c0 += st.rows)
    f(c0, std::min(nk, c0 + st.rows), std::max<int64_t>(0, c0 - off));
}

// Keys of row i a block pair scores: all nk, or up to its own position.
inline int64_t visible_keys(int64_t i, int64_t nk, int64_t off) {
  return std::min(nk, i + off + 1);
}

// Zeroes row i's entries past its visible keys, up to nk: the strips'
// products read them as exact zeros.
inline void zero_invisible(float* row, int64_t i, int64_t nk, int64_t off) {
  const int64_t n = visible_keys(i, nk, off);
  if (n < nk) std::fill(row + n, row + nk, 0.0f);
}

// dst [n x D] (rows D apart) = n rows of D floats `stride` apart. The tile
// kernel reads its B operand a row at a time and A through two strides:
// rows of the packed qkv are (Hq + 2 Hkv) D floats apart, a multiple of
// 4 KiB for common shapes, so k successive rows fall in a few L1 sets and
// evict each other; rows D apart do not (~5-10% of the fp32 backward at
// T >= 1024, docs/kernels.md).
inline void gather_rows(float* dst, const float* rows, int64_t stride, int64_t n, int64_t D) {
  for (int64_t j = 0; j < n; ++j) {
    if (j + kRowsAhead < n) prefetch_row(rows + (j + kRowsAhead) * stride, D * 4);
    std::copy(rows + j * stride, rows + j * stride + D, dst + j * D);
  }
}

// The query pieces of a view: its queries [q0, q0 + Tq) cut at global
// multiples of kBlock, so that a piece and a key block are either disjoint
// in position or the key block holds the piece (the masked pair).
struct Piece {
  int64_t g0;    // first global position
  int64_t i0;    // first local row (g0 - q0)
  int64_t mq;    // rows
  int64_t G;     // the key block that holds it (its start)
  int64_t next;  // g0 + mq: the keys it may see are [0, next)
};

inline Piece piece_at(int64_t g0, int64_t q0, int64_t Tk) {
  const int64_t G = g0 / kBlock * kBlock;
  const int64_t next = std::min(G + kBlock, Tk);
  return {g0, g0 - q0, next - g0, G, next};
}

// The element-wise steps both tile paths share.

// Folds a block pair's scores s (ld kBlock) into its query rows' online
// softmax: running max m, sum l, and the unnormalised output acc (ld D)
// rescaled; s becomes the block's probabilities, zero past each row's keys.
void online_softmax_rows(float* s, float* m, float* l, float* acc, int64_t mq, int64_t nk,
                         int64_t off, int64_t D) {
  for (int64_t i = 0; i < mq; ++i) {
    float* row = s + i * kBlock;
    const int64_t n = visible_keys(i, nk, off);
    const float mx = max_of(row, n, m[i]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = fast_exp(row[j] - mx);
      sum += row[j];
    }
    zero_invisible(row, i, nk, off);
    const float c = fast_exp(m[i] - mx);
    m[i] = mx;
    l[i] = l[i] * c + sum;
    float* acc_row = acc + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc_row[d] *= c;
  }
}

// A query piece's output rows (acc / l) and their log-sum-exp.
void finish_rows(const AttentionView& a, int64_t b, int64_t h, const Piece& p, const float* acc,
                 const float* m, const float* l) {
  const int64_t D = a.D;
  float* o = a.out + b * a.out_batch + p.i0 * a.out_row + h * D;
  for (int64_t i = 0; i < p.mq; ++i) {
    if (i + kRowsAhead < p.mq) prefetch_row(o + (i + kRowsAhead) * a.out_row, D * 4, true);
    const float inv = 1.0f / l[i];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[i * a.out_row + d] = acc[i * D + d] * inv;
    a.lse[(b * a.Hq + h) * a.Tq + p.i0 + i] = m[i] + std::log(l[i]);
  }
}

// delta[hh][t] = dO . O of query row t, for the query heads of kv head g.
void row_deltas(float* delta, const AttentionView& a, const float* dout, int64_t b, int64_t g) {
  const int64_t D = a.D, group = a.Hq / a.Hkv;
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = g * group + hh;
    for (int64_t t = 0; t < a.Tq; ++t) {
      const float* o = a.out + b * a.out_batch + t * a.out_row + h * D;
      const float* d_o = dout + b * a.out_batch + t * a.out_row + h * D;
      if (t + kRowsAhead < a.Tq) {
        prefetch_row(o + kRowsAhead * a.out_row, D * 4);
        prefetch_row(d_o + kRowsAhead * a.out_row, D * 4);
      }
      delta[hh * a.Tq + t] = dot(d_o, o, D);
    }
  }
}

// The backward's probabilities, from the scores in p and each row's saved
// log-sum-exp; zero past each row's keys.
void probabilities(float* p, const float* row_lse, int64_t mq, int64_t nk, int64_t off) {
  for (int64_t i = 0; i < mq; ++i) {
    float* row = p + i * kBlock;
    const float li = row_lse[i];
    const int64_t n = visible_keys(i, nk, off);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = fast_exp(row[j] - li);
    zero_invisible(row, i, nk, off);
  }
}

// dS = P * (dP - delta) * scale in place of dP; zero past each row's keys.
void score_gradients(float* dp, const float* p, const float* delta, int64_t mq, int64_t nk,
                     int64_t off, float scale) {
  for (int64_t i = 0; i < mq; ++i) {
    const float di = delta[i];
    float* ds = dp + i * kBlock;
    const float* pr = p + i * kBlock;
    const int64_t n = visible_keys(i, nk, off);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) ds[j] = pr[j] * (ds[j] - di) * scale;
    zero_invisible(ds, i, nk, off);
  }
}

// The three products of a block pair, on the tile kernel or on BLAS. The
// tile kernel reads B row by row, so A B^T takes B^T laid out as
// [D][kBlock] (transposed_block) with its columns zero up to a whole vector.
class TileProducts {
 public:
  explicit TileProducts(bool kernel) : kernel_(kernel), lanes_(kernel ? tile_gemm_lanes() : 1) {}
  bool kernel() const { return kernel_; }
  Strips strips() const { return kernel_ ? Strips{12, true} : Strips{16, false}; }

  // bt [D][kBlock] = the n rows of a key/value block (rows `stride` apart)
  // transposed; columns n .. n rounded up to a vector are zero.
  void transposed_block(float* bt, const float* rows, int64_t stride, int64_t n, int64_t D) const {
    const int64_t padded = round_up(n);
    tile_transpose(bt, kBlock, rows, stride, n, D);
    for (int64_t d = 0; d < D; ++d) std::fill(bt + d * kBlock + n, bt + d * kBlock + padded, 0.0f);
  }

  // C [m x n] = alpha A B^T (A [m x k], B [n x k]; bt: B^T from transposed_block).
  // The tile kernel also writes columns n .. n rounded up to a vector (zeros).
  void nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, const float* bt, float* c, int64_t ldc) const {
    if (kernel_) {
      tile_gemm(m, round_up(n), k, alpha, false, a, lda, 1, bt, kBlock, c, ldc);
    } else {
      device::gemm(false, true, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc, kTileGemm);
    }
  }
  // C [m x n] (+)= A B (A [m x k], B [k x n]).
  void nn(int64_t m, int64_t n, int64_t k, bool accumulate, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc) const {
    if (kernel_) {
      tile_gemm(m, n, k, 1.0f, accumulate, a, lda, 1, b, ldb, c, ldc);
    } else {
      device::gemm(false, false, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc,
           kTileGemm);
    }
  }
  // C [m x n] += A^T B (A [k x m], B [k x n]).
  void tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc) const {
    if (kernel_) {
      tile_gemm(m, n, k, 1.0f, true, a, 1, lda, b, ldb, c, ldc);
    } else {
      device::gemm(true, false, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc, kTileGemm);
    }
  }

 private:
  int64_t round_up(int64_t n) const { return (n + lanes_ - 1) / lanes_ * lanes_; }
  bool kernel_;
  int64_t lanes_;
};

TileProducts tile_products(AttentionTiles tiles, int64_t D) {
  if (tiles == AttentionTiles::automatic) tiles = attention_tiles();
  if (tiles == AttentionTiles::kernel && tile_gemm_lanes() == 0)
    throw InputError("attention tiles: this build has no tile kernel (expected blas)");
  // The tile kernel's B rows are whole vectors: head sizes that are not take BLAS.
  return TileProducts(tiles == AttentionTiles::kernel && D % tile_gemm_lanes() == 0);
}

// Scores of one block pair: s[i][j] = scale * q_i . k_j (ld kBlock) for the
// keys each row sees (visible_keys); entries past them are left unwritten or
// stale, and every caller reads only the visible ones or zeroes the rest.
// q rows are `qs` apart, k rows `ks`; kt is k's transposed block (tile kernel).
void block_scores(const TileProducts& tp, float* s, const float* q, int64_t qs, const float* k,
                  int64_t ks, const float* kt, int64_t mq, int64_t nk, int64_t D, float scale,
                  int64_t off) {
  for_each_row_strip(tp.strips(), mq, nk, off, [&](int64_t r0, int64_t r1, int64_t kend) {
    for (int64_t i = r1; i < std::min(mq, 2 * r1 - r0); ++i) prefetch_row(q + i * qs, D * 4);
    tp.nt(r1 - r0, kend, D, scale, q + r0 * qs, qs, k, ks, kt, s + r0 * kBlock, kBlock);
  });
}

// A key block's dK and dV rows ([nk x D] each) into the outputs: written,
// or added with accumulate_kv.
void store_kv_grads(const AttentionGrads& g_out, int64_t b, int64_t g, int64_t j0, int64_t nk,
                    int64_t D, const float* dk, const float* dv) {
  float* dkr = g_out.dk + b * g_out.dkv_batch + j0 * g_out.dkv_row + g * D;
  float* dvr = g_out.dv + b * g_out.dkv_batch + j0 * g_out.dkv_row + g * D;
  for (int64_t j = 0; j < nk; ++j) {
    float* kr = dkr + j * g_out.dkv_row;
    float* vr = dvr + j * g_out.dkv_row;
    if (j + kRowsAhead < nk) {
      prefetch_row(kr + kRowsAhead * g_out.dkv_row, D * 4, true);
      prefetch_row(vr + kRowsAhead * g_out.dkv_row, D * 4, true);
    }
    if (g_out.accumulate_kv) {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        kr[d] += dk[j * D + d];
        vr[d] += dv[j * D + d];
      }
    } else {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        kr[d] = dk[j * D + d];
        vr[d] = dv[j * D + d];
      }
    }
  }
}

// ---- bf16 tiles (AVX512_BF16) ----
// The same blocks, strips and online softmax as the fp32 tile kernel, with
// every product on tile_gemm_bf16: its inputs (Q, K, V, dO, and the
// probabilities P and dS of a block pair) rounded to bf16 and laid out as
// pairs of consecutive k, its sums in fp32. The softmax, the running
// statistics, delta and the outputs stay fp32.
constexpr Strips kPairStrips{12, true};

inline int64_t round16(int64_t n) {
  return (n + 15) / 16 * 16;
}

// A key or value block for the products against it: `across` [ceil(n/2)][D]
// (pairs of rows: the B side of P V and dS K) and `transposed` [D/2][kBlock]
// (pairs of dimensions, keys as columns, zero up to a whole vector: the B
// side of Q K^T and dO V^T). `scratch` holds n * D / 2 pairs.
void pack_key_block(uint32_t* across, uint32_t* transposed, uint32_t* scratch, const float* rows,
                    int64_t stride, int64_t n, int64_t D) {
  if (across != nullptr) bf16_pairs_across_rows(across, D, rows, stride, n, D);
  if (transposed == nullptr) return;
  bf16_pairs_transposed(transposed, kBlock, rows, stride, n, D, scratch);
  for (int64_t p = 0; p < D / 2; ++p)
    std::fill(transposed + p * kBlock + n, transposed + p * kBlock + round16(n), 0u);
}

// Scores of one block pair on the bf16 tiles (block_scores' contract); qa:
// the query rows' pairs [mq][D/2], kt: the key block's transposed pairs.
void block_scores_bf16(float* s, const uint32_t* qa, const uint32_t* kt, int64_t mq, int64_t nk,
                       int64_t D, float scale, int64_t off) {
  for_each_row_strip(kPairStrips, mq, nk, off, [&](int64_t r0, int64_t r1, int64_t kend) {
    tile_gemm_bf16(r1 - r0, round16(kend), D / 2, scale, false, qa + r0 * (D / 2), D / 2, 1, kt,
                   kBlock, s + r0 * kBlock, kBlock);
  });
}

// Rows of a block pair's P or dS as pairs of keys: an odd nk's last pair
// takes a zero for the key past the block.
void pack_probabilities(uint32_t* out, float* rows, int64_t mq, int64_t nk) {
  if (nk % 2 != 0) {
    for (int64_t i = 0; i < mq; ++i) rows[i * kBlock + nk] = 0.0f;
  }
  bf16_pairs_along_rows(out, kBlock / 2, rows, kBlock, mq, nk + nk % 2);
}

void attention_forward_bf16(const AttentionView& a) {
  const int64_t D = a.D, Hq = a.Hq, q0 = a.q0, Tk = a.q0 + a.Tq;
  const int64_t group = Hq / a.Hkv;
  const int64_t key_blocks = (Tk + kBlock - 1) / kBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> s(kBlock * kBlock), acc(kBlock * D), m(kBlock), l(kBlock);
    std::vector<uint32_t> t(kBlock * D / 2), qa(kBlock * D / 2), pa(kBlock * kBlock / 2),
        kt(key_blocks * D / 2 * kBlock), vp(key_blocks * kBlock / 2 * D);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < a.B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float* k = a.k + b * a.kv_batch + (h / group) * D;
        const float* v = a.v + b * a.kv_batch + (h / group) * D;
        int64_t packed = 0;  // key blocks in kt and vp
        for (int64_t g0 = q0; g0 < Tk;) {
          const Piece p = piece_at(g0, q0, Tk);
          g0 = p.next;
          const int64_t mq = p.mq;
          for (; packed * kBlock <= p.G; ++packed) {
            const int64_t j0 = packed * kBlock;
            const int64_t n = j0 == p.G ? p.next - j0 : kBlock;
            pack_key_block(nullptr, kt.data() + j0 * D / 2, t.data(), k + j0 * a.kv_row, a.kv_row,
                           n, D);
            bf16_pairs_across_rows(vp.data() + j0 / 2 * D, D, v + j0 * a.kv_row, a.kv_row, n, D);
          }
          bf16_pairs_along_rows(qa.data(), D / 2, a.q + b * a.q_batch + p.i0 * a.q_row + h * D,
                                a.q_row, mq, D);
          std::fill(acc.begin(), acc.begin() + mq * D, 0.0f);
          std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
          std::fill(l.begin(), l.end(), 0.0f);
          for (int64_t j0 = 0; j0 <= p.G; j0 += kBlock) {
            const bool held = j0 == p.G;
            const int64_t nk = held ? p.next - j0 : kBlock;
            const int64_t off = held ? p.g0 - j0 : kFull;
            block_scores_bf16(s.data(), qa.data(), kt.data() + j0 * D / 2, mq, nk, D, scale, off);
            online_softmax_rows(s.data(), m.data(), l.data(), acc.data(), mq, nk, off, D);
            pack_probabilities(pa.data(), s.data(), mq, nk);
            for_each_row_strip(kPairStrips, mq, nk, off, [&](int64_t r0, int64_t r1, int64_t kend) {
              tile_gemm_bf16(r1 - r0, D, (kend + 1) / 2, 1.0f, true, pa.data() + r0 * (kBlock / 2),
                             kBlock / 2, 1, vp.data() + j0 / 2 * D, D, acc.data() + r0 * D, D);
            });
          }
          finish_rows(a, b, h, p, acc.data(), m.data(), l.data());
        }
      }
    }
  }
}

// The backward of attention_forward_bf16, in attention_backward's order
// (one task per batch row and kv head, key blocks outermost). A task lays
// out its queries and output gradients once, every piece of every head of
// its group (4 x Tq x D / 2 pairs a head), and each key and value block once
// (remaking a piece's layouts for every key block it meets makes the
// backward ~10% slower at T = 2048: docs/kernels.md). The transposed
// products read pairs of query rows; a key strip's first row is taken down
// to an even one, whose rows before it see none of the strip's keys (their
// P and dS there are exact zeros).
void attention_backward_bf16(const AttentionView& a, const float* dout,
                             const AttentionGrads& g_out) {
  const int64_t D = a.D, Hq = a.Hq, Hkv = a.Hkv, Tq = a.Tq, q0 = a.q0, Tk = a.q0 + a.Tq;
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  constexpr int64_t kHalf = kBlock / 2;
  // The query pieces, in order: every key block meets a run of them that
  // ends with the last, so their layouts are made once per task.
  std::vector<Piece> pieces;
  for (int64_t g0 = q0; g0 < Tk; g0 = pieces.back().next) pieces.push_back(piece_at(g0, q0, Tk));
  const auto n_pieces = static_cast<int64_t>(pieces.size());
  const int64_t slot = kBlock * D / 2;  // one layout of one piece, in pairs
#pragma omp parallel
  {
    std::vector<float> p(kBlock * kBlock), dp(kBlock * kBlock), dk(kBlock * D), dv(kBlock * D),
        delta(group * Tq);
    std::vector<uint32_t> t(kBlock * D / 2), kt(D / 2 * kBlock), vt(D / 2 * kBlock),
        k_across(kHalf * D), p_across(kHalf * kBlock), ds_across(kHalf * kBlock),
        ds_along(kBlock * kHalf), layouts(group * n_pieces * 4 * slot);
    // Q and dO of head hh, piece pi: along rows (A of Q K^T, dO V^T) and
    // across rows (B of dS^T Q, P^T dO).
    auto layout = [&](int64_t hh, int64_t pi, int64_t which) {
      return layouts.data() + ((hh * n_pieces + pi) * 4 + which) * slot;
    };
    enum { q_along, q_across, do_along, do_across };
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < a.B; ++b) {
      for (int64_t g = 0; g < Hkv; ++g) {
        row_deltas(delta.data(), a, dout, b, g);
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t h = g * group + hh;
          for (int64_t pi = 0; pi < n_pieces; ++pi) {
            const Piece& pc = pieces[static_cast<size_t>(pi)];
            const float* q = a.q + b * a.q_batch + pc.i0 * a.q_row + h * D;
            const float* d_o = dout + b * a.out_batch + pc.i0 * a.out_row + h * D;
            bf16_pairs_along_rows(layout(hh, pi, q_along), D / 2, q, a.q_row, pc.mq, D);
            bf16_pairs_across_rows(layout(hh, pi, q_across), D, q, a.q_row, pc.mq, D);
            bf16_pairs_along_rows(layout(hh, pi, do_along), D / 2, d_o, a.out_row, pc.mq, D);
            bf16_pairs_across_rows(layout(hh, pi, do_across), D, d_o, a.out_row, pc.mq, D);
          }
        }
        for (int64_t j0 = 0; j0 < Tk; j0 += kBlock) {
          const int64_t nk_all = std::min(kBlock, Tk - j0);
          const float* k = a.k + b * a.kv_batch + j0 * a.kv_row + g * D;
          const float* v = a.v + b * a.kv_batch + j0 * a.kv_row + g * D;
          pack_key_block(k_across.data(), kt.data(), t.data(), k, a.kv_row, nk_all, D);
          pack_key_block(nullptr, vt.data(), t.data(), v, a.kv_row, nk_all, D);
          std::fill(dk.begin(), dk.begin() + nk_all * D, 0.0f);
          std::fill(dv.begin(), dv.begin() + nk_all * D, 0.0f);
          for (int64_t hh = 0; hh < group; ++hh) {
            const int64_t h = g * group + hh;
            for (int64_t pi = 0; pi < n_pieces; ++pi) {
              const Piece& pc = pieces[static_cast<size_t>(pi)];
              if (pc.next <= j0) continue;  // before the key block: sees none of it
              const int64_t mq = pc.mq;
              const bool held = pc.G == j0;
              const int64_t nk = held ? pc.next - j0 : kBlock;
              const int64_t off = held ? pc.g0 - j0 : kFull;
              const uint32_t* qa = layout(hh, pi, q_along);
              const uint32_t* q_pairs = layout(hh, pi, q_across);
              const uint32_t* doa = layout(hh, pi, do_along);
              const uint32_t* do_pairs = layout(hh, pi, do_across);
              block_scores_bf16(p.data(), qa, kt.data(), mq, nk, D, scale, off);
              probabilities(p.data(), a.lse + (b * Hq + h) * Tq + pc.i0, mq, nk, off);
              bf16_pairs_across_rows(p_across.data(), kBlock, p.data(), kBlock, mq, nk);
              // dV += P^T dO.
              for_each_key_strip(kPairStrips, nk, off, [&](int64_t c0, int64_t c1, int64_t first) {
                const int64_t f = first / 2;
                tile_gemm_bf16(c1 - c0, D, (mq + 1) / 2 - f, 1.0f, true,
                               p_across.data() + f * kBlock + c0, 1, kBlock, do_pairs + f * D, D,
                               dv.data() + c0 * D, D);
              });
              // dP = dO V^T.
              for_each_row_strip(
                  kPairStrips, mq, nk, off, [&](int64_t r0, int64_t r1, int64_t kend) {
                    tile_gemm_bf16(r1 - r0, round16(kend), D / 2, 1.0f, false, doa + r0 * (D / 2),
                                   D / 2, 1, vt.data(), kBlock, dp.data() + r0 * kBlock, kBlock);
                  });
              score_gradients(dp.data(), p.data(), delta.data() + hh * Tq + pc.i0, mq, nk, off,
                              scale);
              pack_probabilities(ds_along.data(), dp.data(), mq, nk);
              bf16_pairs_across_rows(ds_across.data(), kBlock, dp.data(), kBlock, mq, nk);
              // dQ (+)= dS K: key block 0 is every query piece's first and writes.
              float* dq = g_out.dq + b * g_out.dq_batch + pc.i0 * g_out.dq_row + h * D;
              for_each_row_strip(
                  kPairStrips, mq, nk, off, [&](int64_t r0, int64_t r1, int64_t kend) {
                    tile_gemm_bf16(r1 - r0, D, (kend + 1) / 2, 1.0f, j0 != 0,
                                   ds_along.data() + r0 * kHalf, kHalf, 1, k_across.data(), D,
                                   dq + r0 * g_out.dq_row, g_out.dq_row);
                  });
              // dK += dS^T Q.
              for_each_key_strip(kPairStrips, nk, off, [&](int64_t c0, int64_t c1, int64_t first) {
                const int64_t f = first / 2;
                tile_gemm_bf16(c1 - c0, D, (mq + 1) / 2 - f, 1.0f, true,
                               ds_across.data() + f * kBlock + c0, 1, kBlock, q_pairs + f * D, D,
                               dk.data() + c0 * D, D);
              });
            }
          }
          store_kv_grads(g_out, b, g, j0, nk_all, D, dk.data(), dv.data());
        }
      }
    }
  }
}

const AttentionView& checked_bf16(const AttentionView& a) {
  if (!tile_gemm_bf16_available() || a.D % 16 != 0)
    throw std::logic_error(
        "attention: the bf16 tiles need AVX512_BF16 and a head size of 16k (D = " +
        std::to_string(a.D) + "); see attention_tiles_for");
  return a;
}

}  // namespace

AttentionTiles attention_tiles() {
  static const AttentionTiles tiles = [] {
    const std::string want = env_choice("ANVIL_ATTENTION_TILES", {"auto", "kernel", "blas"});
    if (want == "blas") return AttentionTiles::blas;
    if (want == "kernel") {
      if (tile_gemm_lanes() == 0)
        throw InputError(
            "ANVIL_ATTENTION_TILES=kernel: this build has no tile kernel (expected auto or blas)");
      return AttentionTiles::kernel;
    }
    return tile_gemm_lanes() == 16 ? AttentionTiles::kernel : AttentionTiles::blas;
  }();
  return tiles;
}

bool bf16_attention_tiles() {
  static const bool tiles = [] {
    const std::string want = env_choice("ANVIL_BF16_ATTENTION", {"auto", "tiles", "fp32"});
    const bool can = tile_gemm_bf16_available() &&
                     device::bf16_path() == device::Bf16Path::native &&
                     attention_tiles() == AttentionTiles::kernel;
    if (want == "fp32") return false;
    if (want == "tiles") {
      if (!can)
        throw InputError(
            "ANVIL_BF16_ATTENTION=tiles: the bf16 tiles need AVX512_BF16, the native bf16 "
            "path and the tile kernel (expected auto or fp32 here)");
      return true;
    }
    // Measured against the fp32 tile kernel in the same run (`anvil bench
    // attention --dtype bf16|fp32`, docs/kernels.md): faster on AMD Zen 4
    // and Zen 5, whose AVX512_BF16 dot products outrun their fp32 FMAs;
    // 0.70-0.73x on the Intel Xeon with AMX, where they do not.
    return can && cpu_info().vendor == "AuthenticAMD";
  }();
  return tiles;
}

AttentionTiles attention_tiles_for(bool bf16_matmuls, int64_t D) {
  if (bf16_matmuls && D % 16 == 0 && bf16_attention_tiles()) return AttentionTiles::bf16;
  return AttentionTiles::automatic;
}

std::string attention_tiles_description(AttentionTiles tiles) {
  if (tiles == AttentionTiles::bf16) return "bf16 tile kernel (AVX512_BF16, 6 x 64 register tile)";
  if (tiles == AttentionTiles::automatic) tiles = attention_tiles();
  return tiles == AttentionTiles::kernel
             ? std::string("tile kernel (") + tile_gemm_description() + ")"
             : std::string("BLAS (OpenBLAS, single-threaded per tile)");
}

// Forward, flash-attention style on [kBlock x D] tiles: for each query piece
// the key blocks up to the one that holds it are visited with an online
// softmax. One task per (batch, head); on the tile kernel each key block is
// transposed once per task, when the first piece that reaches it does.
void attention_forward(const AttentionView& a, AttentionTiles tiles) {
  const StepPartScope part(StepPart::attention);
  if (tiles == AttentionTiles::bf16) return attention_forward_bf16(checked_bf16(a));
  const int64_t D = a.D, Hq = a.Hq, q0 = a.q0, Tk = a.q0 + a.Tq;
  const TileProducts tp = tile_products(tiles, D);
  const int64_t group = Hq / a.Hkv;
  const int64_t key_blocks = (Tk + kBlock - 1) / kBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> s(kBlock * kBlock), acc(kBlock * D), m(kBlock), l(kBlock),
        kt(tp.kernel() ? key_blocks * D * kBlock : 0),
        vc(tp.kernel() ? key_blocks * kBlock * D : 0);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < a.B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float* k = a.k + b * a.kv_batch + (h / group) * D;
        const float* v = a.v + b * a.kv_batch + (h / group) * D;
        // The values as P V reads them: gathered (tile kernel) or in place.
        const float* vb = tp.kernel() ? vc.data() : v;
        const int64_t vld = tp.kernel() ? D : a.kv_row;
        int64_t transposed = 0;  // key blocks in kt and vc
        for (int64_t g0 = q0; g0 < Tk;) {
          const Piece p = piece_at(g0, q0, Tk);
          g0 = p.next;
          const int64_t mq = p.mq;
          const float* q = a.q + b * a.q_batch + p.i0 * a.q_row + h * D;
          if (tp.kernel()) {
            for (; transposed * kBlock <= p.G; ++transposed) {
              const int64_t j0 = transposed * kBlock, n = j0 == p.G ? p.next - j0 : kBlock;
              tp.transposed_block(kt.data() + transposed * D * kBlock, k + j0 * a.kv_row, a.kv_row,
                                  n, D);
              gather_rows(vc.data() + j0 * D, v + j0 * a.kv_row, a.kv_row, n, D);
            }
          }
          std::fill(acc.begin(), acc.begin() + mq * D, 0.0f);
          std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
          std::fill(l.begin(), l.end(), 0.0f);
          for (int64_t j0 = 0; j0 <= p.G; j0 += kBlock) {
            const bool held = j0 == p.G;
            const int64_t nk = held ? p.next - j0 : kBlock;
            const int64_t off = held ? p.g0 - j0 : kFull;
            const float* ktj = tp.kernel() ? kt.data() + j0 * D : nullptr;  // block j0 / kBlock
            block_scores(tp, s.data(), q, a.q_row, k + j0 * a.kv_row, a.kv_row, ktj, mq, nk, D,
                         scale, off);
            online_softmax_rows(s.data(), m.data(), l.data(), acc.data(), mq, nk, off, D);
            for_each_row_strip(tp.strips(), mq, nk, off, [&](int64_t r0, int64_t r1, int64_t kend) {
              tp.nn(r1 - r0, D, kend, true, s.data() + r0 * kBlock, kBlock, vb + j0 * vld, vld,
                    acc.data() + r0 * D, D);
            });
          }
          finish_rows(a, b, h, p, acc.data(), m.data(), l.data());
        }
      }
    }
  }
}

// Backward on [kBlock x D] tiles. One task per (batch, kv head) so that the
// query heads of a group, which all add to the same dK/dV rows, and every
// query piece's dQ stay in one task: no atomics, a fixed summation order.
// For each key block the probabilities are recomputed from the saved
// log-sum-exp and
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - delta) * scale,
//   dQ += dS K,    dK += dS^T Q   (delta = rowsum(dO * O)).
// On the tile kernel the key block and the value block are transposed once
// per key block, for every query piece and head of the group.
void attention_backward(const AttentionView& a, const float* dout, const AttentionGrads& g_out,
                        AttentionTiles tiles) {
  const StepPartScope part(StepPart::attention);
  if (tiles == AttentionTiles::bf16) return attention_backward_bf16(checked_bf16(a), dout, g_out);
  const int64_t D = a.D, Hq = a.Hq, Hkv = a.Hkv, Tq = a.Tq, q0 = a.q0, Tk = a.q0 + a.Tq;
  const TileProducts tp = tile_products(tiles, D);
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> p(kBlock * kBlock), dp(kBlock * kBlock), dk(kBlock * D), dv(kBlock * D),
        delta(group * Tq), kt(tp.kernel() ? D * kBlock : 0), vt(tp.kernel() ? D * kBlock : 0),
        kc(tp.kernel() ? kBlock * D : 0), qc(tp.kernel() ? group * Tq * D : 0),
        doc(tp.kernel() ? group * Tq * D : 0);
    // Q and dO rows of head hh from local row i, and their stride: gathered
    // once per task for the tile kernel, else in place.
    const int64_t q_ld = tp.kernel() ? D : a.q_row, do_ld = tp.kernel() ? D : a.out_row;
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < a.B; ++b) {
      for (int64_t g = 0; g < Hkv; ++g) {
        row_deltas(delta.data(), a, dout, b, g);
        auto q_rows = [&](int64_t hh, int64_t i) {
          return tp.kernel() ? qc.data() + (hh * Tq + i) * D
                             : a.q + b * a.q_batch + i * a.q_row + (g * group + hh) * D;
        };
        auto do_rows = [&](int64_t hh, int64_t i) {
          return tp.kernel() ? doc.data() + (hh * Tq + i) * D
                             : dout + b * a.out_batch + i * a.out_row + (g * group + hh) * D;
        };
        if (tp.kernel()) {
          for (int64_t hh = 0; hh < group; ++hh) {
            const int64_t h = g * group + hh;
            gather_rows(qc.data() + hh * Tq * D, a.q + b * a.q_batch + h * D, a.q_row, Tq, D);
            gather_rows(doc.data() + hh * Tq * D, dout + b * a.out_batch + h * D, a.out_row, Tq, D);
          }
        }
        for (int64_t j0 = 0; j0 < Tk; j0 += kBlock) {
          const int64_t nk_all = std::min(kBlock, Tk - j0);
          const float* k = a.k + b * a.kv_batch + j0 * a.kv_row + g * D;
          const float* v = a.v + b * a.kv_batch + j0 * a.kv_row + g * D;
          if (tp.kernel()) {
            tp.transposed_block(kt.data(), k, a.kv_row, nk_all, D);
            tp.transposed_block(vt.data(), v, a.kv_row, nk_all, D);
            gather_rows(kc.data(), k, a.kv_row, nk_all, D);
          }
          // The keys as dS K reads them.
          const float* kb = tp.kernel() ? kc.data() : k;
          const int64_t k_ld = tp.kernel() ? D : a.kv_row;
          std::fill(dk.begin(), dk.begin() + nk_all * D, 0.0f);
          std::fill(dv.begin(), dv.begin() + nk_all * D, 0.0f);
          for (int64_t hh = 0; hh < group; ++hh) {
            const int64_t h = g * group + hh;
            for (int64_t g0 = std::max(q0, j0); g0 < Tk;) {
              const Piece pc = piece_at(g0, q0, Tk);
              g0 = pc.next;
              const int64_t mq = pc.mq;
              const bool held = pc.G == j0;
              const int64_t nk = held ? pc.next - j0 : kBlock;
              const int64_t off = held ? pc.g0 - j0 : kFull;
              const float* q = q_rows(hh, pc.i0);
              const float* d_o = do_rows(hh, pc.i0);
              block_scores(tp, p.data(), q, q_ld, k, a.kv_row, kt.data(), mq, nk, D, scale, off);
              probabilities(p.data(), a.lse + (b * Hq + h) * Tq + pc.i0, mq, nk, off);
              for_each_key_strip(tp.strips(), nk, off, [&](int64_t c0, int64_t c1, int64_t first) {
                tp.tn(c1 - c0, D, mq - first, p.data() + first * kBlock + c0, kBlock,
                      d_o + first * do_ld, do_ld, dv.data() + c0 * D, D);
              });
              for_each_row_strip(tp.strips(), mq, nk, off,
                                 [&](int64_t r0, int64_t r1, int64_t kend) {
                                   tp.nt(r1 - r0, kend, D, 1.0f, d_o + r0 * do_ld, do_ld, v,
                                         a.kv_row, vt.data(), dp.data() + r0 * kBlock, kBlock);
                                 });
              score_gradients(dp.data(), p.data(), delta.data() + hh * Tq + pc.i0, mq, nk, off,
                              scale);
              // Key block 0 is every query piece's first: it writes dQ, later ones add.
              float* dq = g_out.dq + b * g_out.dq_batch + pc.i0 * g_out.dq_row + h * D;
              for_each_row_strip(tp.strips(), mq, nk, off,
                                 [&](int64_t r0, int64_t r1, int64_t kend) {
                                   tp.nn(r1 - r0, D, kend, j0 != 0, dp.data() + r0 * kBlock, kBlock,
                                         kb, k_ld, dq + r0 * g_out.dq_row, g_out.dq_row);
                                 });
              for_each_key_strip(tp.strips(), nk, off, [&](int64_t c0, int64_t c1, int64_t first) {
                tp.tn(c1 - c0, D, mq - first, dp.data() + first * kBlock + c0, kBlock,
                      q + first * q_ld, q_ld, dk.data() + c0 * D, D);
              });
            }
          }
          store_kv_grads(g_out, b, g, j0, nk_all, D, dk.data(), dv.data());
        }
      }
    }
  }
}

AttentionView packed_attention(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                               int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t stride = (Hq + 2 * Hkv) * D;
  AttentionView a;
  a.B = B;
  a.Tq = T;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.q = qkv;
  a.q_row = stride;
  a.q_batch = T * stride;
  a.k = qkv + Hq * D;
  a.v = qkv + (Hq + Hkv) * D;
  a.kv_row = stride;
  a.kv_batch = T * stride;
  a.out = out;
  a.out_row = Hq * D;
  a.out_batch = T * Hq * D;
  a.lse = lse;
  return a;
}

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t Hq,
                       int64_t Hkv, int64_t D, AttentionTiles tiles) {
  attention_forward(packed_attention(out, lse, qkv, B, T, Hq, Hkv, D), tiles);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                        AttentionTiles tiles) {
  const AttentionView a =
      packed_attention(const_cast<float*>(out), const_cast<float*>(lse), qkv, B, T, Hq, Hkv, D);
  const int64_t stride = (Hq + 2 * Hkv) * D;
  const AttentionGrads g{dqkv,           stride, T * stride, dqkv + Hq * D, dqkv + (Hq + Hkv) * D,
                         stride,         T * stride, false};
  attention_backward(a, dout, g, tiles);
}

void attention_decode(float* out, const float* q, const float* kcache, const float* vcache,
                      int64_t len, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t group = Hq / Hkv;
  const int64_t stride = Hkv * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> kt(D * kTile), scores(kTile);
  for (int64_t h = 0; h < Hq; ++h) {
    const float* k = kcache + (h / group) * D;
    const float* v = vcache + (h / group) * D;
    float* o = out + h * D;
    std::fill(o, o + D, 0.0f);
    float run_max = -std::numeric_limits<float>::infinity(), run_sum = 0.0f;
    for (int64_t j0 = 0; j0 < len; j0 += kTile) {
      const int64_t n = std::min(kTile, len - j0);
      transpose_tile(kt.data(), k + j0 * stride, stride, n, D);
      tile_scores(scores.data(), q + h * D, kt.data(), D, scale);
      online_softmax_tile(o, &run_max, &run_sum, scores.data(), v + j0 * stride, stride, n, D);
    }
    const float inv = 1.0f / run_sum;
    for (int64_t i = 0; i < D; ++i) o[i] *= inv;
  }
}

}  // namespace anvil::kernels
