#include "anvil/kernels/zaya.hpp"

#include "anvil/kernels/column_sums.hpp"
#include "anvil/kernels/fast_math.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace anvil::kernels {

void residual_merge_forward(float* out, const float* r, const float* h, const float* hs,
                            const float* hb, const float* rs, const float* rb, int64_t N,
                            int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * C;
    const float* hn = h + n * C;
    if (r == nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (hn[c] + hb[c]) * hs[c];
    } else {
      const float* rn = r + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (hn[c] + hb[c]) * hs[c] + (rn[c] + rb[c]) * rs[c];
    }
  }
}

void residual_merge_backward(float* dr, float* dh, float* dhs, float* dhb, float* drs, float* drb,
                             const float* dout, const float* r, const float* h, const float* hs,
                             const float* hb, const float* rs, const float* rb, int64_t N,
                             int64_t C, GradStore store) {
  // One pass over the rows: the input gradients, and the sums the scales
  // need (sum d, sum d (h + hb), sum d (r + rb)).
  const bool add = store == GradStore::add;
  std::vector<float> sums(static_cast<size_t>(3 * C));
  column_sums(sums.data(), 3, N, C, [&](int64_t n, float* s) {
    const float* d = dout + n * C;
    const float* hn = h + n * C;
    float* dhn = dh + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      dhn[c] = (add ? dhn[c] : 0.0f) + d[c] * hs[c];
      s[c] += d[c];
      s[C + c] += d[c] * (hn[c] + hb[c]);
    }
    if (r == nullptr) return;
    const float* rn = r + n * C;
    float* drn = dr + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      drn[c] = (add ? drn[c] : 0.0f) + d[c] * rs[c];
      s[2 * C + c] += d[c] * (rn[c] + rb[c]);
    }
  });
  const float *sum_d = sums.data(), *sum_dh = sum_d + C, *sum_dr = sum_dh + C;
  for (int64_t c = 0; c < C; ++c) {
    dhs[c] += sum_dh[c];
    dhb[c] += sum_d[c] * hs[c];
    if (r != nullptr) {
      drs[c] += sum_dr[c];
      drb[c] += sum_d[c] * rs[c];
    }
  }
}

// x Phi(x) on the vectorised CDF (fast_math.hpp), not libm's scalar erf.
void gelu_erf_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] * fast_normal_cdf(inp[i]);
}

void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float pdf = 0.3989422804014327f * fast_exp(-0.5f * x * x);
    dinp[i] += dout[i] * (fast_normal_cdf(x) + x * pdf);
  }
}

void router_select_forward(int32_t* choice, float* gate, float* probs, const float* logits,
                           const float* bias, int64_t N, int64_t classes, int64_t k) {
  if (k < 1 || k > classes) throw std::invalid_argument("router_select_forward: k out of range");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* z = logits + n * classes;
    float* p = probs + n * classes;
    float maxv = z[0];
    for (int64_t e = 1; e < classes; ++e) maxv = std::max(maxv, z[e]);
    float sum = 0;
    for (int64_t e = 0; e < classes; ++e) {
      p[e] = std::exp(z[e] - maxv);
      sum += p[e];
    }
    for (int64_t e = 0; e < classes; ++e) p[e] /= sum;
    // k passes of argmax over the classes not yet taken (k is small).
    int32_t* c = choice + n * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < classes; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || c[i] == e;
        // Ties go to the lower index, as torch.argmax does.
        if (!taken && (best < 0 || p[e] + bias[e] > p[best] + bias[best])) {
          best = static_cast<int32_t>(e);
        }
      }
      c[j] = best;
      gate[n * k + j] = p[best];
    }
  }
}

void router_select_backward(float* dlogits, const float* dgate, const int32_t* choice,
                            const float* probs, int64_t N, int64_t classes, int64_t k) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * classes;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t c = choice[n * k + j];
      const float g = dgate[n * k + j] * p[c];
      for (int64_t e = 0; e < classes; ++e) dlogits[n * classes + e] += g * ((e == c) - p[e]);
    }
  }
}

namespace {

float logsumexp(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i] - m));
  return m + static_cast<float>(std::log(s));
}

}  // namespace

RouterLosses router_losses(const float* probs, const float* logits,
                           const int64_t* tokens_per_expert, float coef_aux, float coef_z,
                           int64_t N, int64_t E) {
  RouterLosses r;
  const int64_t K = E + 1;
  if (coef_aux != 0.0f) {
    for (int64_t e = 0; e < E; ++e) {
      double P = 0;
      for (int64_t n = 0; n < N; ++n) P += probs[n * K + e];
      const double f = static_cast<double>(tokens_per_expert[e]) / static_cast<double>(N);
      r.aux += f * P / static_cast<double>(N);
    }
    r.aux *= static_cast<double>(coef_aux) * static_cast<double>(E);
  }
  if (coef_z != 0.0f) {
    for (int64_t n = 0; n < N; ++n) {
      const double lse = logsumexp(logits + n * K, K);
      r.z += lse * lse;
    }
    r.z *= static_cast<double>(coef_z) / static_cast<double>(N);
  }
  return r;
}

void router_losses_backward(float* dlogits, const float* probs, const float* logits,
                            const int64_t* tokens_per_expert, float coef_aux, float coef_z,
                            float scale, int64_t N, int64_t E) {
  const int64_t K = E + 1;
  // d aux / d p[n, e] = coef_aux * E * f_e / N (experts only), then through the softmax.
  std::vector<float> g(static_cast<size_t>(K), 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    g[e] = coef_aux * static_cast<float>(E) * static_cast<float>(tokens_per_expert[e]) /
           (static_cast<float>(N) * static_cast<float>(N));
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * K;
    float* d = dlogits + n * K;
    float pg = 0.0f;
    for (int64_t k = 0; k < K; ++k) pg += p[k] * g[k];
    const float zg = coef_z != 0.0f
                         ? 2.0f * coef_z * logsumexp(logits + n * K, K) / static_cast<float>(N)
                         : 0.0f;
    for (int64_t k = 0; k < K; ++k) d[k] += scale * (p[k] * (g[k] - pg) + zg * p[k]);
  }
}

}  // namespace anvil::kernels
