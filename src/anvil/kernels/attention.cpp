// Causal multi-head / grouped-query attention on the CPU, flash-attention
// style: keys are visited in tiles of kTile with an online (running max)
// softmax; the forward keeps only the output and the per-row log-sum-exp, and
// the backward recomputes the probabilities from them. Memory is O(tile) per
// thread, never O(T^2). Each key/value tile is transposed once to [D][kTile]
// so the scores of a query row against the tile are kTile-wide vector FMAs
// rather than kTile horizontal dot products. See layers.hpp for layouts.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "anvil/kernels/fast_math.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::kernels {
namespace {

constexpr int64_t kTile = 64;

// dst[d * kTile + j] = src[j * stride + d] for the n <= kTile rows of a tile;
// columns past n are zero.
void transpose_tile(float* dst, const float* src, int64_t stride, int64_t n, int64_t D) {
  std::fill(dst, dst + D * kTile, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < D; ++d) dst[d * kTile + j] = src[j * stride + d];
  }
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

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t Hq,
                       int64_t Hkv, int64_t D) {
  const int64_t stride = (Hq + 2 * Hkv) * D;
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> kt(D * kTile), scores(kTile), run_max(T), run_sum(T);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float* base = qkv + b * T * stride;
        const float* k = base + Hq * D + (h / group) * D;
        const float* v = k + Hkv * D;
        float* o = out + b * T * Hq * D + h * D;
        for (int64_t t = 0; t < T; ++t) {
          std::fill(o + t * Hq * D, o + t * Hq * D + D, 0.0f);
          run_max[t] = -std::numeric_limits<float>::infinity();
          run_sum[t] = 0.0f;
        }
        for (int64_t j0 = 0; j0 < T; j0 += kTile) {
          const int64_t n = std::min(kTile, T - j0);
          transpose_tile(kt.data(), k + j0 * stride, stride, n, D);
          for (int64_t t = j0; t < T; ++t) {
            tile_scores(scores.data(), base + t * stride + h * D, kt.data(), D, scale);
            online_softmax_tile(o + t * Hq * D, &run_max[t], &run_sum[t], scores.data(),
                                v + j0 * stride, stride, std::min(n, t - j0 + 1), D);
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          const float inv = 1.0f / run_sum[t];
          float* row = o + t * Hq * D;
#pragma omp simd
          for (int64_t i = 0; i < D; ++i) row[i] *= inv;
          lse[(b * Hq + h) * T + t] = run_max[t] + std::log(run_sum[t]);
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                        int64_t D) {
  const int64_t stride = (Hq + 2 * Hkv) * D;
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // One task per (batch, kv head): the query heads of a group all add to the
  // same dK/dV rows, so they stay in one task and need no atomics.
#pragma omp parallel
  {
    std::vector<float> kt(D * kTile), vt(D * kTile), p(kTile), ds(kTile), delta(T);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t g = 0; g < Hkv; ++g) {
        const float* base = qkv + b * T * stride;
        float* dbase = dqkv + b * T * stride;
        const float* k = base + Hq * D + g * D;
        const float* v = k + Hkv * D;
        float* dk = dbase + Hq * D + g * D;
        float* dv = dk + Hkv * D;
        for (int64_t j0 = 0; j0 < T; j0 += kTile) {
          const int64_t n = std::min(kTile, T - j0);
          transpose_tile(kt.data(), k + j0 * stride, stride, n, D);
          transpose_tile(vt.data(), v + j0 * stride, stride, n, D);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            const float* o = out + b * T * Hq * D + h * D;
            const float* d_o = dout + b * T * Hq * D + h * D;
            if (j0 == 0) {
              for (int64_t t = 0; t < T; ++t) delta[t] = dot(d_o + t * Hq * D, o + t * Hq * D, D);
            } else if (group > 1) {
              for (int64_t t = j0; t < T; ++t) delta[t] = dot(d_o + t * Hq * D, o + t * Hq * D, D);
            }
            for (int64_t t = j0; t < T; ++t) {
              const float* q = base + t * stride + h * D;
              const float* dot_row = d_o + t * Hq * D;
              const float row_lse = lse[(b * Hq + h) * T + t];
              const int64_t m = std::min(n, t - j0 + 1);  // causal: keys <= t
              tile_scores(p.data(), q, kt.data(), D, scale);
              tile_scores(ds.data(), dot_row, vt.data(), D, 1.0f);  // dp_j = do . v_j
#pragma omp simd
              for (int64_t j = 0; j < kTile; ++j) {
                p[j] = j < m ? fast_exp(p[j] - row_lse) : 0.0f;
                ds[j] = p[j] * (ds[j] - delta[t]) * scale;
              }
              float* dq = dbase + t * stride + h * D;
              for (int64_t j = 0; j < m; ++j) {
                const int64_t row = (j0 + j) * stride;
                axpy(dq, ds[j], k + row, D);
                axpy(dk + row, ds[j], q, D);
                axpy(dv + row, p[j], dot_row, D);
              }
            }
          }
        }
      }
    }
  }
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
