#include "anvil/kernels/moe.hpp"

#include <cstddef>
#include <vector>

namespace anvil::kernels {

int64_t moe_dispatch(int32_t* order, int64_t* offsets, int32_t* slot, const int32_t* choice,
                     int64_t N, int64_t k, int64_t E) {
  // Counting sort: stable, O(N k + E).
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  for (int64_t a = 0; a < N * k; ++a) {
    if (choice[a] < E) ++count[choice[a]];
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + count[e];
  std::vector<int64_t> next(offsets, offsets + E);
  for (int64_t a = 0; a < N * k; ++a) {
    const int32_t e = choice[a];
    if (e >= E) {
      slot[a] = -1;
      continue;
    }
    const int64_t row = next[e]++;
    order[row] = static_cast<int32_t>(a);
    slot[a] = static_cast<int32_t>(row);
  }
  return offsets[E];
}

void moe_gather(float* xs, const float* x, const int32_t* order, int64_t rows, int64_t k,
                int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = x + (order[i] / k) * C;
    float* dst = xs + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dst[c] = src[c];
  }
}

void moe_gather_backward(float* dx, const float* dxs, const int32_t* slot, int64_t N, int64_t k,
                         int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = slot[n * k + j];
      if (s < 0) continue;
      const float* src = dxs + static_cast<int64_t>(s) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[n * C + c] += src[c];
    }
  }
}

void moe_combine_forward(float* out, const float* ys, const float* x, const float* gate,
                         const int32_t* slot, bool skip_identity, int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t a = n * k + j;
      const float* src = slot[a] >= 0 ? ys + static_cast<int64_t>(slot[a]) * C
                                      : (skip_identity ? x + n * C : nullptr);
      if (src == nullptr) continue;
      const float g = gate[a];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += g * src[c];
    }
  }
}

void moe_combine_backward(float* dys, float* dgate, float* dx, const float* dout, const float* ys,
                          const float* x, const float* gate, const int32_t* slot,
                          bool skip_identity, int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* d = dout + n * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t a = n * k + j;
      const float g = gate[a];
      if (slot[a] >= 0) {
        const int64_t row = slot[a];
        float dot = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
          dys[row * C + c] = g * d[c];
          dot += d[c] * ys[row * C + c];
        }
        dgate[a] += dot;
      } else if (skip_identity) {
        float dot = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
          dx[n * C + c] += g * d[c];
          dot += d[c] * x[n * C + c];
        }
        dgate[a] += dot;
      }
    }
  }
}

}  // namespace anvil::kernels
