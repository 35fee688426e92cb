#include "anvil/model/cca_layer.hpp"

#include <algorithm>
#include <cstring>

#include "anvil/base/error.hpp"
#include "anvil/kernels/cca.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::model {

CcaLayer::CcaLayer(CcaShape shape, int64_t B, int64_t S, std::shared_ptr<Scratch> scratch)
    : s_(shape),
      B_(B),
      S_(S),
      N_(B * S),
      sc_(scratch ? std::move(scratch) : std::make_shared<Scratch>()) {
  if (s_.kv_heads != 2) {
    throw InputError(
        "CCA attention: n_kv_heads must be 2 (current- and previous-token values), got " +
        std::to_string(s_.kv_heads));
  }
  if (s_.q_heads % s_.kv_heads != 0 || s_.rotary_dim > s_.head_dim || s_.rotary_dim % 2 != 0) {
    throw InputError(
        "CCA attention: needs n_heads divisible by 2 and an even rotary_dim <= head_dim");
  }
  const int64_t C = s_.channels(), d = s_.head_dim, Hq = s_.q_heads, Hkv = s_.kv_heads;
  const int64_t qkv_width = (Hq + 2 * Hkv) * d;
  auto sized = [](std::vector<float>& v, int64_t n) { v.assign(static_cast<size_t>(n), 0.0f); };
  sized(u_, N_ * C);
  sized(D_, N_ * C);
  sized(conv_, N_ * C);
  sized(qk_pre_, N_ * C);
  sized(norms_, N_ * (Hq + Hkv));
  sized(qkv_, N_ * qkv_width);
  sized(xv2_, N_ * d);
  sized(att_, N_ * Hq * d);
  sized(lse_, B_ * Hq * S_);
  auto at_least = [](std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.assign(static_cast<size_t>(n), 0.0f);
  };
  at_least(sc_->d_att, N_ * Hq * d);
  at_least(sc_->d_qkv, N_ * qkv_width);
  at_least(sc_->d_qk_pre, N_ * C);
  at_least(sc_->d_u, N_ * C);
  at_least(sc_->d_conv, N_ * C);
  at_least(sc_->d_v, N_ * d);
}

size_t CcaLayer::Scratch::bytes() const {
  return (d_att.size() + d_qkv.size() + d_qk_pre.size() + d_u.size() + d_conv.size() + d_v.size()) *
         sizeof(float);
}

size_t CcaLayer::bytes() const {
  size_t n = 0;
  for (const auto* v : {&u_, &D_, &conv_, &qk_pre_, &norms_, &qkv_, &xv2_, &att_, &lse_}) {
    n += v->size() * sizeof(float);
  }
  return n;
}

void CcaLayer::forward(float* out, const float* x, const CcaParams& p) {
  const int64_t H = s_.hidden, C = s_.channels(), d = s_.head_dim;
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, Cq = s_.q_latent();
  const int64_t W = (Hq + 2 * Hkv) * d;  // the attention kernel's row: q | k | v
  // 1. u = [qp | kp]; values.
  kernels::linear_forward(u_.data(), x, w(p.wqk), nullptr, N_, H, C, low_scratch_);
  kernels::linear_forward(xv2_.data(), x, w(p.wv2), nullptr, N_, H, d, low_scratch_);
  std::vector<float>& vcur = sc_->d_v;  // free until backward
  kernels::linear_forward(vcur.data(), x, w(p.wv1), nullptr, N_, H, d, low_scratch_);
  for (int64_t n = 0; n < N_; ++n) {
    float* v = qkv_.data() + n * W + (Hq + Hkv) * d;
    std::memcpy(v, vcur.data() + n * d, d * sizeof(float));  // kv head 0: this token
    if (n % S_ == 0) {
      std::fill(v + d, v + 2 * d, 0.0f);  // x_{-1} = 0
    } else {
      std::memcpy(v + d, xv2_.data() + (n - 1) * d, d * sizeof(float));  // kv head 1: previous
    }
  }
  // 2-4. Convolutions, mean skip path (pre-norm q | k into qk_pre).
  kernels::cca_conv_forward(conv_.data(), D_.data(), u_.data(), p.conv0_w, p.conv0_b, p.conv1_w,
                            p.conv1_b, B_, S_, C, d);
  kernels::cca_mean_skip_forward(qk_pre_.data(), qk_pre_.data() + Cq, C, u_.data(), u_.data() + Cq,
                                 C, conv_.data(), N_, Hq, Hkv, d);
  // 5. L2 norm into the attention rows (keys times the temperature).
  std::vector<float>& normed = sc_->d_qk_pre;  // free until backward
  kernels::l2norm_heads_forward(normed.data(), norms_.data(), qk_pre_.data(), nullptr, N_, Hq, d,
                                C);
  kernels::l2norm_heads_forward(normed.data() + Cq, norms_.data() + N_ * Hq, qk_pre_.data() + Cq,
                                p.temp, N_, Hkv, d, C);
  for (int64_t n = 0; n < N_; ++n) {
    std::memcpy(qkv_.data() + n * W, normed.data() + n * C, C * sizeof(float));
  }
  // 6-9. RoPE, attention, output projection.
  kernels::rope_forward(qkv_.data(), N_, S_, 0, Hq + Hkv, d, s_.rotary_dim, W, s_.rope_theta);
  kernels::attention_forward(att_.data(), lse_.data(), qkv_.data(), B_, S_, Hq, Hkv, d);
  kernels::linear_forward(out, att_.data(), w(p.wo), nullptr, N_, Cq, H, low_scratch_);
}

void CcaLayer::backward(float* dx, const CcaParams& g, const float* dout, const float* x,
                        const CcaParams& p) {
  const int64_t H = s_.hidden, C = s_.channels(), d = s_.head_dim;
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, Cq = s_.q_latent();
  const int64_t W = (Hq + 2 * Hkv) * d;
  auto zero = [](std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); };
  zero(sc_->d_att);
  kernels::linear_backward(sc_->d_att.data(), g.wo, nullptr, dout, att_.data(), w(p.wo), N_, Cq, H,
                           low_scratch_);
  kernels::attention_backward(sc_->d_qkv.data(), sc_->d_att.data(), qkv_.data(), att_.data(),
                              lse_.data(), B_, S_, Hq, Hkv, d);
  kernels::rope_backward(sc_->d_qkv.data(), N_, S_, 0, Hq + Hkv, d, s_.rotary_dim, W,
                         s_.rope_theta);
  // L2 norm backward: gather the q | k gradients into C-wide rows first.
  std::vector<float>& d_normed = sc_->d_conv;  // free until the mean-skip backward
  for (int64_t n = 0; n < N_; ++n) {
    std::memcpy(d_normed.data() + n * C, sc_->d_qkv.data() + n * W, C * sizeof(float));
  }
  zero(sc_->d_qk_pre);
  kernels::l2norm_heads_backward(sc_->d_qk_pre.data(), nullptr, d_normed.data(), qk_pre_.data(),
                                 norms_.data(), nullptr, N_, Hq, d, C);
  kernels::l2norm_heads_backward(sc_->d_qk_pre.data() + Cq, g.temp, d_normed.data() + Cq,
                                 qk_pre_.data() + Cq, norms_.data() + N_ * Hq, p.temp, N_, Hkv, d,
                                 C);
  zero(sc_->d_u);
  zero(sc_->d_conv);  // d_normed is consumed
  kernels::cca_mean_skip_backward(sc_->d_u.data(), sc_->d_u.data() + Cq, sc_->d_conv.data(),
                                  sc_->d_qk_pre.data(), sc_->d_qk_pre.data() + Cq, C, C, N_, Hq,
                                  Hkv, d);
  // sc_->d_qk_pre is consumed by the mean-skip backward: the convolution's scratch.
  kernels::cca_conv_backward(sc_->d_u.data(), g.conv0_w, g.conv0_b, g.conv1_w, g.conv1_b,
                             sc_->d_qk_pre.data(), sc_->d_conv.data(), u_.data(), D_.data(),
                             p.conv0_w, p.conv0_b, p.conv1_w, B_, S_, C, d);
  kernels::linear_backward(dx, g.wqk, nullptr, sc_->d_u.data(), x, w(p.wqk), N_, H, C,
                           low_scratch_);
  // Values: head 0 came from x_t Wv1^T, head 1 from x_{t-1} Wv2^T.
  for (int64_t n = 0; n < N_; ++n) {
    std::memcpy(sc_->d_v.data() + n * d, sc_->d_qkv.data() + n * W + (Hq + Hkv) * d,
                d * sizeof(float));
  }
  kernels::linear_backward(dx, g.wv1, nullptr, sc_->d_v.data(), x, w(p.wv1), N_, H, d,
                           low_scratch_);
  zero(sc_->d_v);
  for (int64_t n = 0; n < N_; ++n) {
    if ((n + 1) % S_ == 0) continue;  // the last token of a sequence is nobody's previous
    std::memcpy(sc_->d_v.data() + n * d, sc_->d_qkv.data() + (n + 1) * W + (Hq + Hkv + 1) * d,
                d * sizeof(float));
  }
  kernels::linear_backward(dx, g.wv2, nullptr, sc_->d_v.data(), x, w(p.wv2), N_, H, d,
                           low_scratch_);
}

void CcaLayer::start_decode(int64_t max_len) {
  if (N_ != 1) throw InputError("CCA decode: the layer must be built for B = 1, S = 1");
  const int64_t C = s_.channels(), d = s_.head_dim, Hkv = s_.kv_heads;
  max_len_ = max_len;
  u_prev_.assign(static_cast<size_t>(C), 0.0f);
  D_prev_.assign(static_cast<size_t>(C), 0.0f);
  xv2_prev_.assign(static_cast<size_t>(d), 0.0f);
  kcache_.assign(static_cast<size_t>(max_len * Hkv * d), 0.0f);
  vcache_.assign(static_cast<size_t>(max_len * Hkv * d), 0.0f);
}

void CcaLayer::decode_step(float* out, const float* x, const CcaParams& p, int64_t pos) {
  if (pos < 0 || pos >= max_len_)
    throw InputError("CCA decode: position " + std::to_string(pos) + " outside the cache of " +
                     std::to_string(max_len_) + " (call start_decode)");
  const int64_t H = s_.hidden, C = s_.channels(), d = s_.head_dim;
  const int64_t Hq = s_.q_heads, Hkv = s_.kv_heads, Cq = s_.q_latent();
  const int64_t W = (Hq + 2 * Hkv) * d;
  float* u = u_.data();
  float* D = D_.data();
  float* conv = conv_.data();
  kernels::linear_forward(u, x, p.wqk, nullptr, 1, H, C);
  kernels::linear_forward(xv2_.data(), x, p.wv2, nullptr, 1, H, d);
  float* v = qkv_.data() + (Hq + Hkv) * d;
  kernels::linear_forward(v, x, p.wv1, nullptr, 1, H, d);  // kv head 0: this token
  // kv head 1: the previous token's projection (x_{-1} = 0).
  std::copy(xv2_prev_.begin(), xv2_prev_.end(), v + d);
  // Depthwise tap (older = u_{t-1}, 0 at t = 0), then the grouped one (D_{-1} = b0).
  for (int64_t c = 0; c < C; ++c) {
    const float older = pos == 0 ? 0.0f : u_prev_[c];
    D[c] = p.conv0_w[2 * c] * older + p.conv0_w[2 * c + 1] * u[c] + p.conv0_b[c];
  }
  const float* Dprev = pos == 0 ? p.conv0_b : D_prev_.data();
  for (int64_t c = 0; c < C; ++c) {
    const int64_t base = c / d * d;
    const float* w = p.conv1_w + c * d * 2;
    float s = p.conv1_b[c];
    for (int64_t j = 0; j < d; ++j) s += w[2 * j] * Dprev[base + j] + w[2 * j + 1] * D[base + j];
    conv[c] = s;
  }
  kernels::cca_mean_skip_forward(qk_pre_.data(), qk_pre_.data() + Cq, C, u, u + Cq, C, conv, 1, Hq,
                                 Hkv, d);
  kernels::l2norm_heads_forward(qkv_.data(), norms_.data(), qk_pre_.data(), nullptr, 1, Hq, d, C);
  kernels::l2norm_heads_forward(qkv_.data() + Cq, norms_.data() + Hq, qk_pre_.data() + Cq, p.temp,
                                1, Hkv, d, C);
  kernels::rope_forward(qkv_.data(), 1, 1, pos, Hq + Hkv, d, s_.rotary_dim, W, s_.rope_theta);
  std::copy(qkv_.data() + Cq, qkv_.data() + Cq + Hkv * d, kcache_.data() + pos * Hkv * d);
  std::copy(v, v + Hkv * d, vcache_.data() + pos * Hkv * d);
  kernels::attention_decode(att_.data(), qkv_.data(), kcache_.data(), vcache_.data(), pos + 1, Hq,
                            Hkv, d);
  kernels::linear_forward(out, att_.data(), p.wo, nullptr, 1, Cq, H);
  std::copy(u, u + C, u_prev_.begin());
  std::copy(D, D + C, D_prev_.begin());
  std::copy(xv2_.begin(), xv2_.begin() + d, xv2_prev_.begin());
}

}  // namespace anvil::model
