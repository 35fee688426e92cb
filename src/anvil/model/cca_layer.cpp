// The CCA layer's forward, backward and token-by-token decode over buffers
// carved from the model's arenas (carve, start_decode) or from an arena of
// the layer's own (allocate); the math is in kernels/cca and kernels/layers.
#include "anvil/model/cca_layer.hpp"

#include <algorithm>
#include <cstring>

#include "anvil/base/error.hpp"
#include "anvil/kernels/cca.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::model {

CcaLayer::CcaLayer(CcaShape shape, int64_t B, int64_t S, ContextParallel* cp)
    : s_(shape), B_(B), S_(S), N_(B * S), cp_(cp != nullptr && cp->split() ? cp : nullptr) {
  if (cp_) {  // each of the 2B chunks is a sequence of its own, continued by halos
    B_ = 2 * B;
    S_ = S / 2;
  }
  if (s_.kv_heads != 2) {
    throw InputError(
        "CCA attention: n_kv_heads must be 2 (current- and previous-token values), got " +
        std::to_string(s_.kv_heads));
  }
  if (s_.q_heads % s_.kv_heads != 0 || s_.rotary_dim > s_.head_dim || s_.rotary_dim % 2 != 0) {
    throw InputError(
        "CCA attention: needs n_heads divisible by 2 and an even rotary_dim <= head_dim");
  }
}

namespace {

// The attention kernel's row: q | k | v heads.
int64_t qkv_width(const CcaShape& s) {
  return (s.q_heads + 2 * s.kv_heads) * s.head_dim;
}

}  // namespace

void CcaLayer::Scratch::carve(Carver& c, const CcaShape& s, int64_t rows) {
  const int64_t C = s.channels();
  d_att = c.take<float>(rows * s.q_latent());
  d_qkv = c.take<float>(rows * qkv_width(s));
  d_qk_pre = c.take<float>(rows * C);
  d_u = c.take<float>(rows * C);
  d_conv = c.take<float>(rows * C);
  d_v = c.take<float>(rows * s.head_dim);
}

void CcaLayer::carve(Carver& c, const Scratch& shared) {
  const int64_t C = s_.channels(), d = s_.head_dim, Hq = s_.q_heads, Hkv = s_.kv_heads;
  u_ = c.take<float>(N_ * C);
  D_ = c.take<float>(N_ * C);
  conv_ = c.take<float>(N_ * C);
  qk_pre_ = c.take<float>(N_ * C);
  norms_ = c.take<float>(N_ * (Hq + Hkv));
  qkv_ = c.take<float>(N_ * qkv_width(s_));
  xv2_ = c.take<float>(N_ * d);
  att_ = c.take<float>(N_ * Hq * d);
  lse_ = c.take<float>(B_ * Hq * S_);
  sc_ = shared;
  if (cp_) {
    u_halo_ = c.take<float>(B_ * 2 * C);
    du_halo_ = c.take<float>(B_ * 2 * C);
    v_halo_ = c.take<float>(B_ * d);
    dv_halo_ = c.take<float>(B_ * d);
  }
}

void CcaLayer::rope(float* x, bool backward) const {
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, d = s_.head_dim, W = (Hq + 2 * Hkv) * d;
  auto f = backward ? kernels::rope_backward : kernels::rope_forward;
  if (!cp_) {
    f(x, N_, S_, 0, Hq + Hkv, d, s_.rotary_dim, W, s_.rope_theta);
    return;
  }
  cp_->for_each_chunk([&](int64_t row, int64_t S, int64_t pos) {
    f(x + row * W, S, S, pos, Hq + Hkv, d, s_.rotary_dim, W, s_.rope_theta);
  });
}

void CcaLayer::allocate() {
  own_ = carve_arena("cca layer", [&](Carver& c) {
    Scratch scratch{};
    scratch.carve(c, s_, N_);
    carve(c, scratch);
  });
}

void CcaLayer::forward(float* out, const float* x, const CcaParams& p) {
  const int64_t H = s_.hidden, C = s_.channels(), d = s_.head_dim;
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, Cq = s_.q_latent();
  const int64_t W = (Hq + 2 * Hkv) * d;  // the attention kernel's row: q | k | v
  // 1. u = [qp | kp]; values.
  kernels::linear_forward(u_, x, w(p.wqk), nullptr, N_, H, C, low_scratch_);
  kernels::linear_forward(xv2_, x, w(p.wv2), nullptr, N_, H, d, low_scratch_);
  if (cp_) {  // the rows before each chunk, from the rank holding the previous one
    cp_->halo_forward(u_halo_, u_, C, C, 2);
    cp_->halo_forward(v_halo_, xv2_, d, d, 1);
  }
  float* vcur = sc_.d_v;  // free until backward
  kernels::linear_forward(vcur, x, w(p.wv1), nullptr, N_, H, d, low_scratch_);
#pragma omp parallel for schedule(static) if (N_ * 2 * d * 4 >= kernels::kParallelBytes)
  for (int64_t n = 0; n < N_; ++n) {
    float* v = qkv_ + n * W + (Hq + Hkv) * d;
    std::memcpy(v, vcur + n * d, d * sizeof(float));  // kv head 0: this token
    if (n % S_ == 0 && cp_) {
      std::memcpy(v + d, v_halo_ + n / S_ * d, d * sizeof(float));  // zeros before chunk 0
    } else if (n % S_ == 0) {
      std::fill(v + d, v + 2 * d, 0.0f);  // x_{-1} = 0
    } else {
      std::memcpy(v + d, xv2_ + (n - 1) * d, d * sizeof(float));  // kv head 1: previous
    }
  }
  // 2-4. Convolutions, mean skip path (pre-norm q | k into qk_pre).
  kernels::cca_conv_forward(conv_, D_, u_, p.conv0_w, p.conv0_b, p.conv1_w, p.conv1_b, B_, S_, C,
                            d, u_halo_);
  kernels::cca_mean_skip_forward(qk_pre_, qk_pre_ + Cq, C, u_, u_ + Cq, C, conv_, N_, Hq, Hkv, d);
  // 5. L2 norm into the attention rows (keys times the temperature).
  float* normed = sc_.d_qk_pre;  // free until backward
  kernels::l2norm_heads_forward(normed, norms_, qk_pre_, nullptr, N_, Hq, d, C);
  kernels::l2norm_heads_forward(normed + Cq, norms_ + N_ * Hq, qk_pre_ + Cq, p.temp, N_, Hkv, d, C);
  kernels::copy_rows(qkv_, W, normed, C, N_, C);
  // 6-9. RoPE, attention, output projection.
  rope(qkv_, false);
  if (cp_)
    cp_->attention_forward(att_, lse_, qkv_, Hq, Hkv, d, attention_tiles());
  else
    kernels::attention_forward(att_, lse_, qkv_, B_, S_, Hq, Hkv, d, attention_tiles());
  kernels::linear_forward(out, att_, w(p.wo), nullptr, N_, Cq, H, low_scratch_);
}

void CcaLayer::backward(float* dx, const CcaParams& g, const float* dout, const float* x,
                        const CcaParams& p) {
  const int64_t H = s_.hidden, C = s_.channels(), d = s_.head_dim;
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, Cq = s_.q_latent();
  const int64_t W = (Hq + 2 * Hkv) * d;
  using kernels::zero;
  kernels::linear_backward(sc_.d_att, g.wo, nullptr, dout, att_, w(p.wo), N_, Cq, H, low_scratch_,
                           device::GemmBackend::automatic, kernels::GradStore::write_input);
  if (cp_)
    cp_->attention_backward(sc_.d_qkv, sc_.d_att, qkv_, att_, lse_, Hq, Hkv, d, attention_tiles());
  else
    kernels::attention_backward(sc_.d_qkv, sc_.d_att, qkv_, att_, lse_, B_, S_, Hq, Hkv, d,
                                attention_tiles());
  rope(sc_.d_qkv, true);
  // L2 norm backward: gather the q | k gradients into C-wide rows first.
  float* d_normed = sc_.d_conv;  // free until the mean-skip backward
  kernels::copy_rows(d_normed, C, sc_.d_qkv, W, N_, C);
  zero(sc_.d_qk_pre, N_ * C);
  kernels::l2norm_heads_backward(sc_.d_qk_pre, nullptr, d_normed, qk_pre_, norms_, nullptr, N_, Hq,
                                 d, C);
  kernels::l2norm_heads_backward(sc_.d_qk_pre + Cq, g.temp, d_normed + Cq, qk_pre_ + Cq,
                                 norms_ + N_ * Hq, p.temp, N_, Hkv, d, C);
  zero(sc_.d_u, N_ * C);
  zero(sc_.d_conv, N_ * C);  // d_normed is consumed
  kernels::cca_mean_skip_backward(sc_.d_u, sc_.d_u + Cq, sc_.d_conv, sc_.d_qk_pre,
                                  sc_.d_qk_pre + Cq, C, C, N_, Hq, Hkv, d);
  // d_qk_pre is consumed by the mean-skip backward: the convolution's scratch.
  if (cp_) zero(du_halo_, B_ * 2 * C);
  kernels::cca_conv_backward(sc_.d_u, g.conv0_w, g.conv0_b, g.conv1_w, g.conv1_b, sc_.d_qk_pre,
                             sc_.d_conv, u_, D_, p.conv0_w, p.conv0_b, p.conv1_w, B_, S_, C, d,
                             u_halo_, du_halo_);
  // The halo rows' gradients, back to the ranks (or chunks) they came from.
  if (cp_) cp_->halo_backward(sc_.d_u, C, du_halo_, C, 2);
  kernels::linear_backward(dx, g.wqk, nullptr, sc_.d_u, x, w(p.wqk), N_, H, C, low_scratch_,
                           device::GemmBackend::automatic, kernels::GradStore::write_input);
  // Values: head 0 came from x_t Wv1^T, head 1 from x_{t-1} Wv2^T.
  kernels::copy_rows(sc_.d_v, d, sc_.d_qkv + (Hq + Hkv) * d, W, N_, d);
  kernels::linear_backward(dx, g.wv1, nullptr, sc_.d_v, x, w(p.wv1), N_, H, d, low_scratch_);
#pragma omp parallel for schedule(static) if (N_ * d * 4 >= kernels::kParallelBytes)
  for (int64_t n = 0; n < N_; ++n) {
    if ((n + 1) % S_ == 0) {  // a chunk's last token: see the halo below
      std::fill(sc_.d_v + n * d, sc_.d_v + (n + 1) * d, 0.0f);
      continue;
    }
    std::memcpy(sc_.d_v + n * d, sc_.d_qkv + (n + 1) * W + (Hq + Hkv + 1) * d, d * sizeof(float));
  }
  if (cp_) {  // a chunk's first row's previous value came from the chunk before it
    for (int64_t b = 0; b < B_; ++b)
      std::memcpy(dv_halo_ + b * d, sc_.d_qkv + b * S_ * W + (Hq + Hkv + 1) * d, d * sizeof(float));
    cp_->halo_backward(sc_.d_v, d, dv_halo_, d, 1);
  }
  kernels::linear_backward(dx, g.wv2, nullptr, sc_.d_v, x, w(p.wv2), N_, H, d, low_scratch_);
}

void CcaLayer::start_decode(int64_t max_len, Carver& c) {
  if (N_ != 1) throw InputError("CCA decode: the layer must be built for B = 1, S = 1");
  const int64_t C = s_.channels(), d = s_.head_dim, Hkv = s_.kv_heads;
  max_len_ = max_len;
  u_prev_ = c.take<float>(C);
  D_prev_ = c.take<float>(C);
  xv2_prev_ = c.take<float>(d);
  kcache_ = c.take<float>(max_len * Hkv * d);
  vcache_ = c.take<float>(max_len * Hkv * d);
}

void CcaLayer::decode_step(float* out, const float* x, const CcaParams& p, int64_t pos) {
  if (pos < 0 || pos >= max_len_)
    throw InputError("CCA decode: position " + std::to_string(pos) + " outside the cache of " +
                     std::to_string(max_len_) + " (call start_decode)");
  const int64_t H = s_.hidden, C = s_.channels(), d = s_.head_dim;
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, Cq = s_.q_latent();
  const int64_t W = (Hq + 2 * Hkv) * d;
  float* u = u_;
  float* D = D_;
  float* conv = conv_;
  kernels::linear_forward(u, x, p.wqk, nullptr, 1, H, C);
  kernels::linear_forward(xv2_, x, p.wv2, nullptr, 1, H, d);
  float* v = qkv_ + (Hq + Hkv) * d;
  kernels::linear_forward(v, x, p.wv1, nullptr, 1, H, d);  // kv head 0: this token
  // kv head 1: the previous token's projection (x_{-1} = 0).
  std::copy(xv2_prev_, xv2_prev_ + d, v + d);
  // Depthwise tap (older = u_{t-1}, 0 at t = 0), then the grouped one (D_{-1} = b0).
  for (int64_t c = 0; c < C; ++c) {
    const float older = pos == 0 ? 0.0f : u_prev_[c];
    D[c] = p.conv0_w[2 * c] * older + p.conv0_w[2 * c + 1] * u[c] + p.conv0_b[c];
  }
  const float* Dprev = pos == 0 ? p.conv0_b : D_prev_;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t base = c / d * d;
    const float* w = p.conv1_w + c * d * 2;
    float s = p.conv1_b[c];
    for (int64_t j = 0; j < d; ++j) s += w[2 * j] * Dprev[base + j] + w[2 * j + 1] * D[base + j];
    conv[c] = s;
  }
  kernels::cca_mean_skip_forward(qk_pre_, qk_pre_ + Cq, C, u, u + Cq, C, conv, 1, Hq, Hkv, d);
  kernels::l2norm_heads_forward(qkv_, norms_, qk_pre_, nullptr, 1, Hq, d, C);
  kernels::l2norm_heads_forward(qkv_ + Cq, norms_ + Hq, qk_pre_ + Cq, p.temp, 1, Hkv, d, C);
  kernels::rope_forward(qkv_, 1, 1, pos, Hq + Hkv, d, s_.rotary_dim, W, s_.rope_theta);
  std::copy(qkv_ + Cq, qkv_ + Cq + Hkv * d, kcache_ + pos * Hkv * d);
  std::copy(v, v + Hkv * d, vcache_ + pos * Hkv * d);
  kernels::attention_decode(att_, qkv_, kcache_, vcache_, pos + 1, Hq, Hkv, d);
  kernels::linear_forward(out, att_, p.wo, nullptr, 1, Cq, H);
  std::copy(u, u + C, u_prev_);
  std::copy(D, D + C, D_prev_);
  std::copy(xv2_, xv2_ + d, xv2_prev_);
}

}  // namespace anvil::model
