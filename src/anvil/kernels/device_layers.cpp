// device_layers.hpp: a CPU stream runs layers.hpp or the loops below, a
// CUDA stream gpu_layers.hpp's kernels. The loops use bodies.hpp's
// arithmetic, as the kernels do.
#include "anvil/kernels/device_layers.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "anvil/base/error.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/kernels/fast_math.hpp"
#include "anvil/kernels/gpu_layers.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::kernels::dev {
namespace {

bool on_cpu(const device::Stream& s) {
  return s.kind() == device::DeviceKind::cpu;
}

}  // namespace

void convert_to_bf16(device::Stream& s, bf16* dst, const float* src, int64_t n) {
  if (on_cpu(s))
    kernels::convert_to_bf16(dst, src, n);
  else
    gpu::convert_to_bf16(&dst->bits, src, n, s.native());
}

void convert_from_bf16(device::Stream& s, float* dst, const bf16* src, int64_t n) {
  if (!on_cpu(s)) {
    gpu::convert_from_bf16(dst, &src->bits, n, s.native());
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

void embedding_forward(device::Stream& s, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C) {
  if (on_cpu(s))
    kernels::embedding_forward(out, tokens, wte, wpe, B, T, C);
  else
    gpu::embedding_forward(out, tokens, wte, wpe, B * T, T, C, s.native());
}

void group_by_token(const int32_t* tokens, int64_t N, TokenGroups* out) {
  std::vector<int32_t> rows(static_cast<size_t>(N));
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(),
                   [tokens](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  std::vector<int32_t> distinct, offsets;
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = tokens[rows[static_cast<size_t>(i)]];
    if (distinct.empty() || distinct.back() != t) {
      distinct.push_back(t);
      offsets.push_back(static_cast<int32_t>(i));
    }
  }
  offsets.push_back(static_cast<int32_t>(N));
  out->count = static_cast<int64_t>(distinct.size());
  out->packed = std::move(distinct);
  out->packed.insert(out->packed.end(), offsets.begin(), offsets.end());
  out->packed.insert(out->packed.end(), rows.begin(), rows.end());
}

void embedding_backward(device::Stream& s, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                        const int32_t* groups, int64_t group_count) {
  if (on_cpu(s))
    kernels::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  else
    gpu::embedding_backward(dwte, dwpe, dout, groups, group_count, B * T, T, C, s.native());
}

void layernorm_forward(device::Stream& s, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps) {
  if (on_cpu(s))
    kernels::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  else
    gpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, s.native());
}

void layernorm_backward(device::Stream& s, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C, float* scratch) {
  if (on_cpu(s))
    kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  else
    gpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, scratch,
                            s.native());
}

void rmsnorm_forward(device::Stream& s, float* out, float* rstd, const float* inp,
                     const float* weight, int64_t N, int64_t C, float eps) {
  if (on_cpu(s))
    kernels::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  else
    gpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps, s.native());
}

void rmsnorm_backward(device::Stream& s, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int64_t N,
                      int64_t C, float* scratch) {
  if (on_cpu(s))
    kernels::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  else
    gpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, scratch, s.native());
}

void gelu_forward(device::Stream& s, float* out, const float* inp, int64_t n) {
  if (on_cpu(s))
    kernels::gelu_forward(out, inp, n);
  else
    gpu::gelu_forward(out, inp, n, s.native());
}

void gelu_backward(device::Stream& s, float* dinp, const float* inp, const float* dout, int64_t n) {
  if (on_cpu(s))
    kernels::gelu_backward(dinp, inp, dout, n);
  else
    gpu::gelu_backward(dinp, inp, dout, n, s.native());
}

void swiglu_forward(device::Stream& s, float* out, const float* inp, int64_t N, int64_t F) {
  if (on_cpu(s))
    kernels::swiglu_forward(out, inp, N, F);
  else
    gpu::swiglu_forward(out, inp, N, F, s.native());
}

void swiglu_backward(device::Stream& s, float* dinp, const float* dout, const float* inp, int64_t N,
                     int64_t F) {
  if (on_cpu(s))
    kernels::swiglu_backward(dinp, dout, inp, N, F);
  else
    gpu::swiglu_backward(dinp, dout, inp, N, F, s.native());
}

void residual_forward(device::Stream& s, float* out, const float* a, const float* b, int64_t n) {
  if (on_cpu(s))
    kernels::residual_forward(out, a, b, n);
  else
    gpu::residual_forward(out, a, b, n, s.native());
}

void rope(device::Stream& s, float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads,
          int64_t head_dim, int64_t rotary_dim, int64_t row_stride, float theta, bool backward) {
  if (!on_cpu(s)) {
    gpu::rope_apply(x, N, T, pos0, n_heads, head_dim, rotary_dim, row_stride, theta,
                    backward ? -1.0f : 1.0f, s.native());
  } else if (backward) {
    kernels::rope_backward(x, N, T, pos0, n_heads, head_dim, rotary_dim, row_stride, theta);
  } else {
    kernels::rope_forward(x, N, T, pos0, n_heads, head_dim, rotary_dim, row_stride, theta);
  }
}

int64_t column_sum_scratch(int64_t columns) {
  return gpu::column_sum_scratch(columns);
}

void bias_backward(device::Stream& s, float* dbias, const float* dout, int64_t N, int64_t OC,
                   float* scratch) {
  if (!on_cpu(s)) {
    gpu::bias_backward(dbias, dout, N, OC, scratch, s.native());
    return;
  }
  // Columns split over the threads, each summing its rows in order.
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < OC; ++j) {
    float sum = 0.0f;
    for (int64_t n = 0; n < N; ++n) sum += dout[n * OC + j];
    dbias[j] += sum;
  }
}

void causal_softmax_forward(device::Stream& s, float* scores, float* lse, int64_t rows, int64_t T,
                            float scale, int64_t queries) {
  if (queries == 0) queries = T;
  if (queries < 1 || queries > T)
    throw InputError("causal_softmax_forward: expected 1.." + std::to_string(T) + " queries, got " +
                     std::to_string(queries));
  if (!on_cpu(s)) {
    gpu::causal_softmax_forward(scores, lse, rows, T, queries, scale, s.native());
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * T;
    const int64_t last = T - queries + r % queries;
    float mx = -INFINITY;
    for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, scale * row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j <= last; ++j) sum += fast_exp(scale * row[j] - mx);
    const float l = mx + std::log(sum);
    for (int64_t j = 0; j <= last; ++j) row[j] = body::softmax_probability(row[j], scale, l);
    for (int64_t j = last + 1; j < T; ++j) row[j] = 0.0f;
    lse[r] = l;
  }
}

void causal_softmax_backward(device::Stream& s, float* dprobs, const float* probs, int64_t rows,
                             int64_t T, float scale) {
  if (!on_cpu(s)) {
    gpu::causal_softmax_backward(dprobs, probs, rows, T, scale, s.native());
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dprobs + r * T;
    const float* p = probs + r * T;
    const int64_t last = r % T;
    float dot = 0.0f;
    for (int64_t j = 0; j <= last; ++j) dot += p[j] * d[j];
    for (int64_t j = 0; j <= last; ++j) d[j] = body::softmax_dscore(p[j], d[j], dot, scale);
    for (int64_t j = last + 1; j < T; ++j) d[j] = 0.0f;
  }
}

void cross_entropy(device::Stream& s, float* logits, float* row_loss, const int32_t* targets,
                   int64_t N, int64_t V, float grad_scale) {
  if (!on_cpu(s)) {
    gpu::cross_entropy(logits, row_loss, targets, N, V, grad_scale, s.native());
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * V;
    const int32_t target = targets[n];
    float mx = -INFINITY;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    const float target_logit = target >= 0 ? row[target] - mx : 0.0f;
    float sum = 0.0f;
    for (int64_t j = 0; j < V; ++j) sum += fast_exp(row[j] - mx);
    if (target < 0) {
      std::fill(row, row + V, 0.0f);
      row_loss[n] = 0.0f;
      continue;
    }
    const float inv = grad_scale / sum;
    for (int64_t j = 0; j < V; ++j) row[j] = body::cross_entropy_dlogit(fast_exp(row[j] - mx), inv);
    row[target] = body::cross_entropy_target(row[target], grad_scale);
    row_loss[n] = std::log(sum) - target_logit;
  }
}

void adamw(device::Stream& s, float* p, float* m, float* v, const float* g,
           const std::vector<body::AdamWPiece>& pieces, body::AdamWPiece* device_table,
           float grad_scale) {
  if (!on_cpu(s)) {
    constexpr size_t kMaxRows = 65535;  // a grid's rows
    int64_t longest = 0;
    for (const auto& piece : pieces) longest = std::max(longest, piece.n);
    device::copy(device_table, pieces.data(), pieces.size() * sizeof(body::AdamWPiece),
                 device::CopyKind::host_to_device, s);
    for (size_t first = 0; first < pieces.size(); first += kMaxRows) {
      const auto count = static_cast<int64_t>(std::min(kMaxRows, pieces.size() - first));
      gpu::adamw_pieces(p, m, v, g, device_table + first, count, longest, grad_scale, s.native());
    }
    return;
  }
  for (const auto& piece : pieces) {
    float* pp = p + piece.begin;
    float* mp = m + piece.local;
    float* vp = v + piece.local;
    const float* gp = g + piece.begin;
    const body::AdamWStep step = piece.step;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < piece.n; ++i)
      body::adamw(pp + i, mp + i, vp + i, gp[i] * grad_scale, step);
  }
}

void muon_momentum(device::Stream& s, float* buf, float* u, const float* g, int64_t n, float mu,
                   bool nesterov, float grad_scale) {
  if (!on_cpu(s)) {
    gpu::muon_momentum(buf, u, g, n, mu, nesterov, grad_scale, s.native());
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    u[i] = body::muon_momentum(buf + i, g[i] * grad_scale, mu, nesterov);
}

void muon_apply(device::Stream& s, float* p, const float* u, int64_t n, float decay, float step) {
  if (!on_cpu(s)) {
    gpu::muon_apply(p, u, n, decay, step, s.native());
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) body::muon_apply(p + i, u[i], decay, step);
}

void scale(device::Stream& s, float* dst, const float* src, int64_t n, float alpha) {
  if (!on_cpu(s)) {
    gpu::scale(dst, src, n, alpha, s.native());
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * alpha;
}

}  // namespace anvil::kernels::dev
