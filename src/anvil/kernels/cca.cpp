// CCA's convolutions, mean skip path and per-head L2 norm; see cca.hpp.
// Element-wise parts are direct loops, parallel over rows or channels so that
// no two threads write the same value (deterministic); the grouped
// convolution is a group x group matrix per head and tap, run as GEMMs.
#include "anvil/kernels/cca.hpp"

#include "anvil/base/step_parts.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/column_sums.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace anvil::kernels {

namespace {

// A head's dimensions are walked this many at a time where the loop over a
// group's heads sits inside (a stack buffer per stretch, vectorised).
constexpr int64_t kLanes = 64;

// W1 [C, group, 2] -> one [C, group] matrix per tap: taps[tap][c][j].
std::vector<float> split_taps(const float* w1, int64_t C, int64_t group) {
  std::vector<float> taps(static_cast<size_t>(2 * C * group));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < group; ++j) {
      taps[c * group + j] = w1[(c * group + j) * 2];
      taps[C * group + c * group + j] = w1[(c * group + j) * 2 + 1];
    }
  }
  return taps;
}

// D_{t0-1} of each sequence [B, C]: b0 without a halo (D_{-1}), else
// computed from the halo's two rows as every other D row is.
std::vector<float> previous_D(const float* halo, const float* w0, const float* b0, int64_t B,
                              int64_t C) {
  std::vector<float> prev(static_cast<size_t>(B * C));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t c = 0; c < C; ++c) {
      prev[b * C + c] =
          halo == nullptr
              ? b0[c]
              : w0[2 * c] * halo[(2 * b) * C + c] + w0[2 * c + 1] * halo[(2 * b + 1) * C + c] +
                    b0[c];
    }
  }
  return prev;
}

// `count` rows of `width` floats, `stride` apart, kept aside while a GEMM
// over the whole batch writes rows it must leave as they were.
class BoundaryRows {
 public:
  BoundaryRows(int64_t count, int64_t width)
      : count_(std::max<int64_t>(count, 0)),
        width_(width),
        rows_(static_cast<size_t>(count_ * width)) {}
  void save(const float* first, int64_t stride) {
    for (int64_t i = 0; i < count_; ++i)
      std::copy_n(first + i * stride, width_, rows_.data() + i * width_);
  }
  void restore(float* first, int64_t stride) const {
    for (int64_t i = 0; i < count_; ++i)
      std::copy_n(rows_.data() + i * width_, width_, first + i * stride);
  }

 private:
  int64_t count_, width_;
  std::vector<float> rows_;
};

}  // namespace

void cca_conv_forward(float* conv, float* D, const float* u, const float* w0, const float* b0,
                      const float* w1, const float* b1, int64_t B, int64_t S, int64_t C,
                      int64_t group, const float* halo) {
  const int64_t N = B * S;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const bool first = n % S == 0;
    const float* before = first ? (halo == nullptr ? nullptr : halo + (2 * (n / S) + 1) * C)
                                : u + (n - 1) * C;
    float* out = conv + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const float older = before == nullptr ? 0.0f : before[c];
      D[n * C + c] = w0[2 * c] * older + w0[2 * c + 1] * u[n * C + c] + b0[c];
      out[c] = b1[c];
    }
  }
  // The grouped convolution as GEMMs per head: conv[n] += W_1 D[n] + W_0 D[n-1],
  // with D[-1] = b0 at each sequence start (D_{t0-1} from the halo), `edge`.
  const std::vector<float> taps = split_taps(w1, C, group);
  const float* tap0 = taps.data();
  const float* tap1 = taps.data() + C * group;
  const std::vector<float> prev = previous_D(halo, w0, b0, halo == nullptr ? 1 : B, C);
  std::vector<float> edge(static_cast<size_t>(B * C), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const float* dp = prev.data() + (halo == nullptr ? 0 : b * C);
    for (int64_t c = 0; c < C; ++c) {
      const int64_t base = c / group * group;
      for (int64_t j = 0; j < group; ++j) edge[b * C + c] += tap0[c * group + j] * dp[base + j];
    }
  }
  // One task per head (its columns of conv are its own), each GEMM on the
  // task's thread: ten small GEMMs a layer do not pay a parallel region each.
  // Tap 0 runs over the whole batch, rows n >= 1 reading D[n-1]; the first
  // row of every later sequence must not see the sequence before it, so those
  // rows are kept aside and put back (each C element is its own sum, so the
  // others' bits are those of per-sequence GEMMs).
  const int64_t heads = C / group;
  std::optional<StepPartScope> part(StepPart::gemm);  // the GEMMs in the tasks count as GEMMs
#pragma omp parallel
  {
    BoundaryRows starts(B - 1, group);
#pragma omp for schedule(static)
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t base = head * group;
      device::gemm(false, true, N, group, group, 1.0f, D + base, C, tap1 + base * group, group,
                   1.0f, conv + base, C);
      if (S < 2) continue;
      starts.save(conv + S * C + base, S * C);
      device::gemm(false, true, N - 1, group, group, 1.0f, D + base, C, tap0 + base * group, group,
                   1.0f, conv + C + base, C);
      starts.restore(conv + S * C + base, S * C);
    }
  }
  part.reset();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t c = 0; c < C; ++c) conv[b * S * C + c] += edge[b * C + c];
  }
}

void cca_conv_backward(float* du, float* dw0, float* db0, float* dw1, float* db1, float* dD,
                       const float* dconv, const float* u, const float* D, const float* w0,
                       const float* b0, const float* w1, int64_t B, int64_t S, int64_t C,
                       int64_t group, const float* halo, float* dhalo) {
  const int64_t N = B * S;
  const std::vector<float> taps = split_taps(w1, C, group);
  const float* tap0 = taps.data();
  const float* tap1 = taps.data() + C * group;
  // dD[n] = W_1^T dconv[n] + W_0^T dconv[n + 1] (same sequence), per head:
  // tap 1 writes every element, tap 0 adds.
  // dW_tap[c][j] = sum_n dconv[n][c] x (tap 1: D[n]; tap 0: D[n-1]).
  std::vector<float> dtaps(static_cast<size_t>(2 * C * group), 0.0f);
  // One task per head, as in the forward: its columns of dD and its block of
  // the taps' gradients are its own.
  const int64_t heads = C / group;
  std::optional<StepPartScope> part(StepPart::gemm);  // the GEMMs in the tasks count as GEMMs
#pragma omp parallel
  {
    BoundaryRows ends(B - 1, group);
#pragma omp for schedule(static)
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t base = head * group;
      device::gemm(false, false, N, group, group, 1.0f, dconv + base, C, tap1 + base * group, group,
                   0.0f, dD + base, C);
      device::gemm(true, false, group, group, N, 1.0f, dconv + base, C, D + base, C, 1.0f,
                   dtaps.data() + C * group + base * group, group);
      if (S < 2) continue;
      // dD[n] for n < N - 1 from dconv[n + 1] in one GEMM; the last row of
      // every sequence but the last must not see the next one's first row.
      ends.save(dD + (S - 1) * C + base, S * C);
      device::gemm(false, false, N - 1, group, group, 1.0f, dconv + C + base, C,
                   tap0 + base * group, group, 1.0f, dD + base, C);
      ends.restore(dD + (S - 1) * C + base, S * C);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = b * S;
        device::gemm(true, false, group, group, S - 1, 1.0f, dconv + (row + 1) * C + base, C,
                     D + row * C + base, C, 1.0f, dtaps.data() + base * group, group);
      }
    }
  }
  part.reset();
  // The t = 0 rows' tap 0 saw D_{-1} = b0 (D_{t0-1} from the halo): its
  // weight gradient, and that row's gradient (dprev) for b0 (and the halo).
  const std::vector<float> prev = previous_D(halo, w0, b0, halo == nullptr ? 1 : B, C);
  std::vector<float> dprev(static_cast<size_t>((halo == nullptr ? 1 : B) * C), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const float* g = dconv + b * S * C;
    const float* dp = prev.data() + (halo == nullptr ? 0 : b * C);
    float* ddp = dprev.data() + (halo == nullptr ? 0 : b * C);
    for (int64_t c = 0; c < C; ++c) {
      const int64_t base = c / group * group;
      for (int64_t j = 0; j < group; ++j) {
        ddp[base + j] += tap0[c * group + j] * g[c];
        dtaps[c * group + j] += g[c] * dp[base + j];
      }
    }
  }
  std::vector<float> db0_from_edge(static_cast<size_t>(C), 0.0f);
  for (int64_t b = 0; b < (halo == nullptr ? 1 : B); ++b) {
    const float* ddp = dprev.data() + b * C;
    for (int64_t c = 0; c < C; ++c) db0_from_edge[c] += ddp[c];
    if (halo == nullptr) continue;
    // D_{t0-1} = w0[c,0] u_{t0-2} + w0[c,1] u_{t0-1} + b0; and D_{t0} read u_{t0-1}.
    const float* h0 = halo + 2 * b * C;
    const float* h1 = h0 + C;
    float* dh0 = dhalo + 2 * b * C;
    float* dh1 = dh0 + C;
    const float* dD0 = dD + b * S * C;
    for (int64_t c = 0; c < C; ++c) {
      dw0[2 * c] += ddp[c] * h0[c] + dD0[c] * h1[c];
      dw0[2 * c + 1] += ddp[c] * h1[c];
      dh0[c] += w0[2 * c] * ddp[c];
      dh1[c] += w0[2 * c + 1] * ddp[c] + w0[2 * c] * dD0[c];
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < group; ++j) {
      dw1[(c * group + j) * 2] += dtaps[c * group + j];
      dw1[(c * group + j) * 2 + 1] += dtaps[C * group + c * group + j];
    }
  }
  // D -> u (rows).
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const bool has_next = (n + 1) % S != 0;
    for (int64_t c = 0; c < C; ++c) {
      du[n * C + c] +=
          w0[2 * c + 1] * dD[n * C + c] + (has_next ? w0[2 * c] * dD[(n + 1) * C + c] : 0.0f);
    }
  }
  // Channel sums: b1 from dconv; w0 (this row's u and the one before it in
  // the same sequence) and b0 from dD.
  std::vector<float> sums(static_cast<size_t>(4 * C));
  column_sums(sums.data(), 4, N, C, [&](int64_t n, float* s) {
    const float *g = dD + n * C, *dc = dconv + n * C, *un = u + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      s[c] += dc[c];
      s[C + c] += g[c] * un[c];
      s[2 * C + c] += g[c];
    }
    if (n % S == 0) return;
    const float* up = un - C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) s[3 * C + c] += g[c] * up[c];
  });
  for (int64_t c = 0; c < C; ++c) {
    db1[c] += sums[c];
    dw0[2 * c + 1] += sums[C + c];
    db0[c] += db0_from_edge[c] + sums[2 * C + c];
    dw0[2 * c] += sums[3 * C + c];
  }
}

void cca_mean_skip_forward(float* q_out, float* k_out, int64_t out_stride, const float* qp,
                           const float* kp, int64_t qk_stride, const float* conv, int64_t N,
                           int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t g = Hq / Hkv;
  const int64_t conv_stride = (Hq + Hkv) * D;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* q = qp + n * qk_stride;
    const float* k = kp + n * qk_stride;
    const float* cq = conv + n * conv_stride;
    const float* ck = cq + Hq * D;
    float* qo = q_out + n * out_stride;
    float* ko = k_out + n * out_stride;
    // Lanes of a head's dimensions at a time, the group's heads in order
    // inside: each element's sums run in the scalar order.
    for (int64_t j = 0; j < Hkv; ++j) {
      for (int64_t i0 = 0; i0 < D; i0 += kLanes) {
        const int64_t w = std::min(kLanes, D - i0);
        const float* kj = k + j * D + i0;
        float mean[kLanes] = {};
        for (int64_t a = 0; a < g; ++a) {
          const int64_t h = (j * g + a) * D + i0;
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) {
            const float qm = 0.5f * (q[h + i] + kj[i]);
            qo[h + i] = cq[h + i] + qm;
            mean[i] += qm;
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < w; ++i)
          ko[j * D + i0 + i] = ck[j * D + i0 + i] + mean[i] / static_cast<float>(g);
      }
    }
  }
}

void cca_mean_skip_backward(float* dqp, float* dkp, float* dconv, const float* dq, const float* dk,
                            int64_t out_stride, int64_t qk_stride, int64_t N, int64_t Hq,
                            int64_t Hkv, int64_t D) {
  const int64_t g = Hq / Hkv;
  const int64_t conv_stride = (Hq + Hkv) * D;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* dqo = dq + n * out_stride;
    const float* dko = dk + n * out_stride;
    float* dq_in = dqp + n * qk_stride;
    float* dk_in = dkp + n * qk_stride;
    float* dcq = dconv + n * conv_stride;
    float* dck = dcq + Hq * D;
    for (int64_t j = 0; j < Hkv; ++j) {
      for (int64_t i0 = 0; i0 < D; i0 += kLanes) {
        const int64_t w = std::min(kLanes, D - i0), kj = j * D + i0;
        float from_k[kLanes], dkp_sum[kLanes] = {};
#pragma omp simd
        for (int64_t i = 0; i < w; ++i) {
          from_k[i] = dko[kj + i] / static_cast<float>(g);  // d qm[h] from km[j]
          dck[kj + i] += dko[kj + i];
        }
        for (int64_t a = 0; a < g; ++a) {
          const int64_t h = (j * g + a) * D + i0;
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) {
            const float dqm = dqo[h + i] + from_k[i];
            dcq[h + i] += dqo[h + i];
            dq_in[h + i] += 0.5f * dqm;
            dkp_sum[i] += 0.5f * dqm;
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < w; ++i) dk_in[kj + i] += dkp_sum[i];
      }
    }
  }
}

namespace {
constexpr float kNormEps = 1e-12f;  // inside the sqrt: guards an all-zero head
}

void l2norm_heads_forward(float* y, float* norms, const float* x, const float* temp, int64_t N,
                          int64_t heads, int64_t D, int64_t stride) {
  const float root_d = std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* v = x + n * stride + h * D;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < D; ++i) ss += v[i] * v[i];
      const float norm = std::sqrt(ss + kNormEps);
      norms[n * heads + h] = norm;
      const float scale = root_d / norm * (temp != nullptr ? temp[h] : 1.0f);
      float* o = y + n * stride + h * D;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) o[i] = v[i] * scale;
    }
  }
}

void l2norm_heads_backward(float* dx, float* dtemp, const float* dy, const float* x,
                           const float* norms, const float* temp, int64_t N, int64_t heads,
                           int64_t D, int64_t stride) {
  const float root_d = std::sqrt(static_cast<float>(D));
  const int threads = omp_get_max_threads();
  std::vector<double> partial(static_cast<size_t>(threads * heads), 0.0);
#pragma omp parallel
  {
    double* mine = partial.data() + omp_get_thread_num() * heads;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* v = x + n * stride + h * D;
        const float* d = dy + n * stride + h * D;
        const float norm = norms[n * heads + h];
        float dot = 0.0f;  // x_hat . dy
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < D; ++i) dot += v[i] / norm * d[i];
        const float t = temp != nullptr ? temp[h] : 1.0f;
        const float c = root_d * t / norm;
        float* o = dx + n * stride + h * D;
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) o[i] += c * (d[i] - v[i] / norm * dot);
        mine[h] += static_cast<double>(root_d) * dot;  // d/dtemp of temp * sqrt(D) x_hat . dy
      }
    }
  }
  if (dtemp == nullptr) return;
  for (int t = 0; t < threads; ++t)
    for (int64_t h = 0; h < heads; ++h) dtemp[h] += static_cast<float>(partial[t * heads + h]);
}

}  // namespace anvil::kernels
