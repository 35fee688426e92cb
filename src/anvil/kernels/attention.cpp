// Causal multi-head / grouped-query attention on the CPU, flash-attention
// style: keys are visited in tiles of kTile with an online (running max)
// softmax, the forward keeps only out and the per-row log-sum-exp, and the
// backward recomputes the probabilities from them. Memory is O(T) per thread,
// never O(T^2). See layers.hpp for the layouts.
#include <cmath>
#include <limits>
#include <vector>

#include "anvil/kernels/layers.hpp"

namespace anvil::kernels {
namespace {

constexpr int64_t kTile = 64;

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// One query row against keys [0, len): out = softmax(q K^T * scale) V, returns
// the log-sum-exp. k/v rows are `stride` floats apart. `scores` holds kTile.
float attend_row(float* out, const float* q, const float* k, const float* v, int64_t stride,
                 int64_t len, int64_t D, float scale, float* scores) {
  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
  for (int64_t i = 0; i < D; ++i) out[i] = 0.0f;
  for (int64_t j0 = 0; j0 < len; j0 += kTile) {
    const int64_t j1 = std::min(len, j0 + kTile);
    float tile_max = running_max;
    for (int64_t j = j0; j < j1; ++j) {
      scores[j - j0] = dot(q, k + j * stride, D) * scale;
      tile_max = std::max(tile_max, scores[j - j0]);
    }
    const float correction = std::exp(running_max - tile_max);
    running_sum *= correction;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) out[i] *= correction;
    for (int64_t j = j0; j < j1; ++j) {
      const float p = std::exp(scores[j - j0] - tile_max);
      running_sum += p;
      axpy(out, p, v + j * stride, D);
    }
    running_max = tile_max;
  }
  const float inv = 1.0f / running_sum;
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) out[i] *= inv;
  return running_max + std::log(running_sum);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t Hq,
                       int64_t Hkv, int64_t D) {
  const int64_t stride = (Hq + 2 * Hkv) * D;
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> scores(kTile);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float* base = qkv + b * T * stride;
        const float* k = base + Hq * D + (h / group) * D;
        const float* v = k + Hkv * D;
        for (int64_t t = 0; t < T; ++t) {
          lse[(b * Hq + h) * T + t] =
              attend_row(out + (b * T + t) * Hq * D + h * D, base + t * stride + h * D, k, v,
                         stride, t + 1, D, scale, scores.data());
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
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < Hkv; ++g) {
      const float* base = qkv + b * T * stride;
      float* dbase = dqkv + b * T * stride;
      const float* k = base + Hq * D + g * D;
      const float* v = k + Hkv * D;
      float* dk = dbase + Hq * D + g * D;
      float* dv = dk + Hkv * D;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          const float* q = base + t * stride + h * D;
          float* dq = dbase + t * stride + h * D;
          const float* o = out + (b * T + t) * Hq * D + h * D;
          const float* d_o = dout + (b * T + t) * Hq * D + h * D;
          const float row_lse = lse[(b * Hq + h) * T + t];
          const float delta = dot(d_o, o, D);
          for (int64_t j = 0; j <= t; ++j) {
            const float p = std::exp(dot(q, k + j * stride, D) * scale - row_lse);
            const float dp = dot(d_o, v + j * stride, D);
            const float ds = p * (dp - delta) * scale;
            axpy(dv + j * stride, p, d_o, D);
            axpy(dq, ds, k + j * stride, D);
            axpy(dk + j * stride, ds, q, D);
          }
        }
      }
    }
  }
}

void attention_decode(float* out, const float* q, const float* kcache, const float* vcache,
                      int64_t len, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> scores(kTile);
  for (int64_t h = 0; h < Hq; ++h) {
    attend_row(out + h * D, q + h * D, kcache + (h / group) * D, vcache + (h / group) * D, Hkv * D,
               len, D, scale, scores.data());
  }
}

}  // namespace anvil::kernels
