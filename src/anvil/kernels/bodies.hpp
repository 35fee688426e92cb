// The per-element arithmetic of the dense layers, written once for both the
// CPU kernels (layers.cpp, the AdamW update, the classifier loss) and the
// CUDA kernels (gpu_layers.cu): GELU, SwiGLU, the norms' output and input
// gradient, a RoPE pair, the AdamW update and the loss gradient of one
// logit. The CPU loops around them are vectorised (`omp simd` inlines them);
// the GPU runs one thread per element or a block per row around the same
// calls, so the CPU tests check the GPU's arithmetic (test_bodies.cpp, and
// every layer test through layers.cpp).
//
// Reductions (a row's mean, a norm's dot products, a softmax's max and sum)
// are not bodies: each device reduces in its own order, and the tests allow
// for it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "anvil/device/epilogue.hpp"
#include "anvil/device/gpu_compat.hpp"
#include "anvil/kernels/fast_math.hpp"

namespace anvil::kernels::body {

// GELU, tanh form (GPT-2's), and its slope d gelu(x) / dx: the GEMM
// epilogues' (device/epilogue.hpp), on fast_tanh.
ANVIL_HD inline float gelu(float x) {
  return device::gelu_tanh(x);
}
ANVIL_HD inline float gelu_slope(float x) {
  return device::gelu_tanh_slope(x);
}

// SwiGLU of one gate g and one up value u: silu(g) u.
ANVIL_HD inline float swiglu(float g, float u) {
  return g * fast_sigmoid(g) * u;
}

// Adds its gradients for an output gradient d to *dg and *du.
ANVIL_HD inline void swiglu_grads_add(float g, float u, float d, float* dg, float* du) {
  const float sig = fast_sigmoid(g);
  const float silu = g * sig;
  *du += d * silu;
  *dg += d * u * sig * (1.0f + g * (1.0f - sig));
}
// The same gradients written over *dg and *du (the same bits as adding them
// to zeros).
ANVIL_HD inline void swiglu_grads(float g, float u, float d, float* dg, float* du) {
  const float sig = fast_sigmoid(g);
  const float silu = g * sig;
  *du = d * silu;
  *dg = d * u * sig * (1.0f + g * (1.0f - sig));
}

// LayerNorm's output of x, given its row's mean and 1 / sqrt(var + eps).
ANVIL_HD inline float layernorm(float x, float mean, float rstd, float w, float b) {
  return (x - mean) * rstd * w + b;
}

// LayerNorm's input gradient of one element: dnorm = w * dout, norm =
// (x - mean) * rstd; dnorm_mean and dnorm_norm_mean are the row means of
// dnorm and dnorm * norm.
ANVIL_HD inline float layernorm_dx(float dnorm, float norm, float dnorm_mean, float dnorm_norm_mean,
                                   float rstd) {
  return (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
}

// RMSNorm's output of x, given its row's 1 / sqrt(mean(x^2) + eps).
ANVIL_HD inline float rmsnorm(float x, float rstd, float w) {
  return x * rstd * w;
}

// RMSNorm's input gradient of one element: norm = x * rstd, dot is the row
// mean of w * dout * norm.
ANVIL_HD inline float rmsnorm_dx(float norm, float w, float d, float rstd, float dot) {
  return (w * d - norm * dot) * rstd;
}

// RoPE's inverse frequency of pair i of a rotary_dim-wide rotation, in
// double as the CPU's table computes it, then rounded.
ANVIL_HD inline float rope_inv_freq(int i, int rotary_dim, float theta) {
  return static_cast<float>(
      1.0 / pow(static_cast<double>(theta), static_cast<double>(2 * i) / rotary_dim));
}

// Rotates the pair (a, b) = (x[i], x[i + half]) by the angle whose cosine is
// c and sine s (the backward passes -s).
ANVIL_HD inline void rope_pair(float* a, float* b, float c, float s) {
  const float x = *a, y = *b;
  *a = x * c - y * s;
  *b = y * c + x * s;
}

// One AdamW element: decoupled decay, then the moments, then the step.
// step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t),
// decay = 1 - lr * weight_decay (1 where the parameter has none).
struct AdamWStep {
  float beta1, beta2, eps, step_size, bc2_sqrt, decay;
};
// One parameter's (or a block's) part of a multi-tensor step: its n
// elements at `begin` in the parameter and gradient arrays and at `local`
// in the moments, with its constants.
struct AdamWPiece {
  int64_t begin, local, n;
  AdamWStep step;
};
ANVIL_HD inline void adamw(float* p, float* m, float* v, float g, const AdamWStep& s) {
  *p *= s.decay;
  *m = s.beta1 * *m + (1.0f - s.beta1) * g;
  *v = s.beta2 * *v + (1.0f - s.beta2) * g * g;
  *p -= s.step_size * *m / (sqrtf(*v) / s.bc2_sqrt + s.eps);
}

// Muon's heavy-ball momentum of one element (optim/muon.hpp): buf = mu buf
// + g; returns what Newton-Schulz orthogonalises (Nesterov: g + mu buf).
ANVIL_HD inline float muon_momentum(float* buf, float g, float mu, bool nesterov) {
  *buf = mu * *buf + g;
  return nesterov ? g + mu * *buf : *buf;
}
// Muon's weight update of one element: decoupled decay, then the
// orthogonalised update times step (lr x lr scale x the RMS-matching scale).
ANVIL_HD inline void muon_apply(float* p, float update, float decay, float step) {
  *p = *p * decay - step * update;
}

// Muon's start, X = U / (|U|_F + 1e-7): the factor from the norm (the host
// and the GPU compute it the same way from the same norm).
ANVIL_HD inline float muon_unit_factor(double norm) {
  return static_cast<float>(1.0 / (norm + 1e-7));
}

// One gradient's square in fixed point (optim/square_sum.hpp): g^2 x factor
// (factor = 2^scale, the square at most 2^52) rounded to the nearest
// integer. x + 2^52 for 0 <= x <= 2^52 lands on an integer step of 1, so the
// sum's bits less 2^52's are round(x): the same integer on every device,
// and integers add in any order to the same total.
ANVIL_HD inline uint64_t fixed_square(float g, double factor) {
  constexpr double kMagic = 4503599627370496.0;  // 2^52
  const double gd = g;
  const double x = gd * gd * factor + kMagic;  // g^2 x factor is exact: contraction changes nothing
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return static_cast<uint64_t>(__double_as_longlong(x)) - 0x4330000000000000ull;
#else
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits - 0x4330000000000000ull;  // 2^52's bits
#endif
}

// The loss gradient of one logit of a cross-entropy row, scaled: e is
// exp(logit - max) (the row's softmax numerator), inv = scale / row sum.
// The target's then has the scale taken off (cross_entropy_target).
ANVIL_HD inline float cross_entropy_dlogit(float e, float inv) {
  return e * inv;
}
ANVIL_HD inline float cross_entropy_target(float dlogit, float scale) {
  return dlogit - scale;
}

// Attention written as a softmax over explicit scores (the unfused path,
// kernels/device_layers.hpp): a query row's probability of one key is
// exp(scale * score - lse); its score gradient from the probability p, the
// probability's gradient dp and the row's dot = sum_j p_j dp_j is
// p (dp - dot) times the score scale.
ANVIL_HD inline float softmax_probability(float score, float scale, float lse) {
  return fast_exp(scale * score - lse);
}
ANVIL_HD inline float softmax_dscore(float p, float dp, float dot, float scale) {
  return p * (dp - dot) * scale;
}

}  // namespace anvil::kernels::body
