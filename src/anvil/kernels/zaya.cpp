#include "anvil/kernels/zaya.hpp"

#include <omp.h>

#include <cmath>
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
                             int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* d = dout + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dh[n * C + c] += d[c] * hs[c];
    if (r != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dr[n * C + c] += d[c] * rs[c];
    }
  }
  // Per-channel scales: one thread per channel block, rows in order.
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    float g_hs = 0, g_hb = 0, g_rs = 0, g_rb = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float d = dout[n * C + c];
      g_hs += d * (h[n * C + c] + hb[c]);
      g_hb += d * hs[c];
      if (r != nullptr) {
        g_rs += d * (r[n * C + c] + rb[c]);
        g_rb += d * rs[c];
      }
    }
    dhs[c] += g_hs;
    dhb[c] += g_hb;
    if (r != nullptr) {
      drs[c] += g_rs;
      drb[c] += g_rb;
    }
  }
}

void gelu_erf_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
  }
}

void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
    const float pdf = 0.3989422804014327f * std::exp(-0.5f * x * x);
    dinp[i] += dout[i] * (cdf + x * pdf);
  }
}

void router_select_forward(int32_t* choice, float* gate, float* probs, const float* logits,
                           const float* bias, int64_t N, int64_t classes) {
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
    int32_t best = 0;
    for (int64_t e = 0; e < classes; ++e) {
      p[e] /= sum;
      // Ties go to the lower index, as torch.argmax does.
      if (p[e] + bias[e] > p[best] + bias[best]) best = static_cast<int32_t>(e);
    }
    choice[n] = best;
    gate[n] = p[best];
  }
}

void router_select_backward(float* dlogits, const float* dgate, const int32_t* choice,
                            const float* probs, int64_t N, int64_t classes) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * classes;
    const int32_t c = choice[n];
    const float g = dgate[n] * p[c];
    for (int64_t e = 0; e < classes; ++e) dlogits[n * classes + e] += g * ((e == c) - p[e]);
  }
}

}  // namespace anvil::kernels
