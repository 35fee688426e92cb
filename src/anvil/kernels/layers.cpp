// Embedding, norms, linear, activations, residual and RoPE: see layers.hpp.
// Attention and the classifier loss live in attention.cpp and loss.cpp.
#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "anvil/device/gemm.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/kernels/fast_math.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::kernels {
namespace {

// Per-thread partial sums for parameter gradients that every row adds to
// (norm weights, biases), reduced in thread order so results are
// deterministic for a given thread count.
class PartialSums {
 public:
  PartialSums(int64_t width, int n_arrays)
      : width_(width), n_arrays_(n_arrays), threads_(omp_get_max_threads()) {
    data_.assign(static_cast<size_t>(width_ * n_arrays_ * threads_), 0.0f);
  }
  float* mine(int array) {
    return data_.data() + (static_cast<int64_t>(omp_get_thread_num()) * n_arrays_ + array) * width_;
  }
  void add_to(float* dst, int array) const {
    if (dst == nullptr) return;
    for (int t = 0; t < threads_; ++t) {
      const float* src = data_.data() + (static_cast<int64_t>(t) * n_arrays_ + array) * width_;
      for (int64_t i = 0; i < width_; ++i) dst[i] += src[i];
    }
  }

 private:
  int64_t width_;
  int n_arrays_;
  int threads_;
  std::vector<float> data_;
};

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < B * T; ++n) {
    const float* e = wte + static_cast<int64_t>(tokens[n]) * C;
    float* o = out + n * C;
    if (wpe != nullptr) {
      const float* p = wpe + (n % T) * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) o[i] = e[i] + p[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) o[i] = e[i];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
  // Rows sharing a token add to the same embedding row, so threads split the
  // feature axis instead of the rows: no races, a fixed order of additions.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads();
    const int id = omp_get_thread_num();
    const int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
    for (int64_t n = 0; n < B * T; ++n) {
      const float* d = dout + n * C;
      float* e = dwte + static_cast<int64_t>(tokens[n]) * C;
      for (int64_t i = c0; i < c1; ++i) e[i] += d[i];
      if (dwpe != nullptr) {
        float* p = dwpe + (n % T) * C;
        for (int64_t i = c0; i < c1; ++i) p[i] += d[i];
      }
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int64_t i = 0; i < C; ++i) m += x[i];
    m /= static_cast<float>(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + eps);
    float* o = out + n * C;
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) o[i] = body::layernorm(x[i], m, s, weight[i], bias[i]);
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  PartialSums sums(C, 2);
#pragma omp parallel
  {
    float* dw = sums.mine(0);
    float* db = sums.mine(1);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* d = dout + n * C;
      const float m = mean[n], s = rstd[n];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t i = 0; i < C; ++i) {
        const float norm = (x[i] - m) * s;
        const float dnorm = weight[i] * d[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      float* dx = dinp + n * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) {
        const float norm = (x[i] - m) * s;
        const float dnorm = weight[i] * d[i];
        db[i] += d[i];
        dw[i] += norm * d[i];
        dx[i] += body::layernorm_dx(dnorm, norm, dnorm_mean, dnorm_norm_mean, s);
      }
    }
  }
  sums.add_to(dweight, 0);
  sums.add_to(dbias, 1);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < C; ++i) ss += x[i] * x[i];
    const float s = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    float* o = out + n * C;
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) o[i] = body::rmsnorm(x[i], s, weight[i]);
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C) {
  PartialSums sums(C, 1);
#pragma omp parallel
  {
    float* dw = sums.mine(0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* d = dout + n * C;
      const float s = rstd[n];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < C; ++i) dot += weight[i] * d[i] * x[i] * s;
      dot /= static_cast<float>(C);
      float* dx = dinp + n * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) {
        const float norm = x[i] * s;
        dw[i] += norm * d[i];
        dx[i] += body::rmsnorm_dx(norm, weight[i], d[i], s, dot);
      }
    }
  }
  sums.add_to(dweight, 0);
}

void convert_to_bf16(bf16* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += 4096)
    to_bf16(dst + i0, src + i0, std::min<int64_t>(4096, n - i0));
}

namespace {

void check_scratch(const Bf16Scratch* s, int64_t need) {
  if (s == nullptr || s->capacity < need) {
    throw std::logic_error("bf16 matmul: scratch of " + std::to_string(s ? s->capacity : 0) +
                           " elements, need " + std::to_string(need));
  }
}

}  // namespace

void linear_forward(float* out, const float* inp, MatmulWeight weight, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, Bf16Scratch* scratch, device::GemmBackend backend) {
  if (weight.bf16_copy != nullptr) {
    check_scratch(scratch, N * IC);
    convert_to_bf16(scratch->a, inp, N * IC);
    device::gemm(false, true, N, OC, IC, 1.0f, scratch->a, IC, weight.bf16_copy, IC, 0.0f, out, OC,
         backend);
  } else {
    device::gemm(false, true, N, OC, IC, 1.0f, inp, IC, weight.f32, IC, 0.0f, out, OC, backend);
  }
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * OC;
#pragma omp simd
    for (int64_t j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     MatmulWeight weight, int64_t N, int64_t IC, int64_t OC, Bf16Scratch* scratch,
                     device::GemmBackend backend, GradStore store) {
  const float beta = store == GradStore::add ? 1.0f : 0.0f;  // dinp's
  const float beta_w = store == GradStore::write ? 0.0f : 1.0f;
  if (weight.bf16_copy != nullptr) {
    check_scratch(scratch, std::max(N * IC, N * OC));
    convert_to_bf16(scratch->b, dout, N * OC);
    convert_to_bf16(scratch->a, inp, N * IC);
    if (dinp != nullptr) {
      device::gemm(false, false, N, IC, OC, 1.0f, scratch->b, OC, weight.bf16_copy, IC, beta, dinp,
                   IC, backend);
    }
    device::gemm(true, false, OC, IC, N, 1.0f, scratch->b, OC, scratch->a, IC, beta_w, dweight, IC,
                 backend);
  } else {
    if (dinp != nullptr) {
      device::gemm(false, false, N, IC, OC, 1.0f, dout, OC, weight.f32, IC, beta, dinp, IC,
                   backend);
    }
    device::gemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, beta_w, dweight, IC, backend);
  }
  if (dbias == nullptr) return;
  PartialSums sums(OC, 1);
#pragma omp parallel
  {
    float* db = sums.mine(0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* d = dout + n * OC;
#pragma omp simd
      for (int64_t j = 0; j < OC; ++j) db[j] += d[j];
    }
  }
  sums.add_to(dbias, 0);
}

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = body::gelu(inp[i]);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, GradStore store) {
  if (store == GradStore::add) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dinp[i] += dout[i] * body::gelu_slope(inp[i]);
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * body::gelu_slope(inp[i]);
  }
}

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = inp + n * 2 * F;
    const float* u = g + F;
    float* o = out + n * F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) o[i] = body::swiglu(g[i], u[i]);
  }
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F,
                     GradStore store) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = inp + n * 2 * F;
    const float* u = g + F;
    const float* d = dout + n * F;
    float* dg = dinp + n * 2 * F;
    float* du = dg + F;
    if (store != GradStore::add) {  // no weights: write and write_input alike
#pragma omp simd
      for (int64_t i = 0; i < F; ++i) body::swiglu_grads(g[i], u[i], d[i], dg + i, du + i);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < F; ++i) body::swiglu_grads_add(g[i], u[i], d[i], dg + i, du + i);
    }
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void zero_bytes(void* dst, int64_t bytes) {
  auto* p = static_cast<unsigned char*>(dst);
  if (bytes < kParallelBytes) {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    // Cuts at multiples of 64 bytes from dst: whole cache lines per thread
    // when dst is line-aligned, as arena buffers are.
    const auto cut = [&](int64_t j) { return j == nt ? bytes : bytes * j / nt / 64 * 64; };
    const int64_t b0 = cut(id), b1 = cut(id + 1);
    std::memset(p + b0, 0, static_cast<size_t>(b1 - b0));
  }
}

void zero(float* dst, int64_t n) {
  zero_bytes(dst, n * static_cast<int64_t>(sizeof(float)));
}

void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
               int64_t cols) {
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(float);
#pragma omp parallel for schedule(static) if (rows * cols * 4 >= kParallelBytes)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
}

namespace {

// sign = +1 rotates by the position's angle, -1 by its inverse (backward).
void rope_apply(float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                int64_t rotary_dim, int64_t row_stride, float theta, float sign) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = body::rope_inv_freq(static_cast<int>(i), static_cast<int>(rotary_dim), theta);
  // One table of angles per position (not per row): a sequence's rows share it.
  const int64_t P = std::min(N, T);
  std::vector<float> cs(static_cast<size_t>(P * half)), sn(static_cast<size_t>(P * half));
  for (int64_t t = 0; t < P; ++t) {
    const float pos = static_cast<float>(pos0 + t);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cs[t * half + i] = std::cos(angle);
      sn[t * half + i] = sign * std::sin(angle);
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* c = cs.data() + (n % T) * half;
    const float* s = sn.data() + (n % T) * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + n * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) body::rope_pair(v + i, v + i + half, c[i], s[i]);
    }
  }
}

}  // namespace

void rope_forward(float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride, float theta) {
  rope_apply(x, N, T, pos0, n_heads, head_dim, rotary_dim, row_stride, theta, 1.0f);
}

void rope_backward(float* dx, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                   int64_t rotary_dim, int64_t row_stride, float theta) {
  rope_apply(dx, N, T, pos0, n_heads, head_dim, rotary_dim, row_stride, theta, -1.0f);
}

}  // namespace anvil::kernels
