#include "anvil/model/zaya_moe_layer.hpp"

#include <algorithm>
#include <cstring>

#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/moe.hpp"
#include "anvil/kernels/zaya.hpp"

namespace anvil::model {
namespace {

// Expert segments change their row counts every step; oneDNN would build a
// primitive per exact shape (and thrash its cache), so they run on OpenBLAS
// (in bf16: their bf16 inputs widened for OpenBLAS's sgemm).
constexpr auto kSegmentGemm = device::GemmBackend::openblas;

// Every expert here, on the layer's own sorted rows.
class LocalExperts : public ExpertDispatcher {
 public:
  LocalExperts(const ZayaMoeShape& s, int64_t max_rows)
      : s_(s),
        y_(static_cast<size_t>(max_rows * 2 * s.expert_ffn)),
        act_(static_cast<size_t>(max_rows * s.expert_ffn)) {}
  void forward(float* ys, const float* xs, const int64_t* offsets,
               const ZayaMoeParams& p) override {
    xs_ = xs;
    offsets_ = offsets;
    experts_forward(ys, y_.data(), act_.data(), xs, offsets, s_.experts, s_, p, low_, low_scratch_);
  }
  void backward(float* dxs, const ZayaMoeParams& g, const float* dys, const ZayaMoeParams& p,
                std::vector<float>& dy, std::vector<float>& dact) override {
    const int64_t rows = offsets_[s_.experts];
    if (dy.size() < static_cast<size_t>(rows * 2 * s_.expert_ffn))
      dy.resize(static_cast<size_t>(rows * 2 * s_.expert_ffn));
    if (dact.size() < static_cast<size_t>(rows * s_.expert_ffn))
      dact.resize(static_cast<size_t>(rows * s_.expert_ffn));
    experts_backward(dxs, dy.data(), dact.data(), g, dys, xs_, y_.data(), act_.data(), offsets_,
                     s_.experts, s_, p, low_, low_scratch_);
  }
  size_t bytes() const override { return (y_.size() + act_.size()) * sizeof(float); }

 private:
  ZayaMoeShape s_;
  std::vector<float> y_, act_;
  const float* xs_ = nullptr;
  const int64_t* offsets_ = nullptr;
};

}  // namespace

int64_t experts_bf16_scratch(const ZayaMoeShape& s, int64_t rows) {
  return rows * std::max(2 * s.expert_ffn, s.hidden);
}

void experts_forward(float* ys, float* y, float* act, const float* xs, const int64_t* seg,
                     int64_t count, const ZayaMoeShape& s, const ZayaMoeParams& p,
                     const kernels::Bf16Weights* low, kernels::Bf16Scratch* scratch) {
  const int64_t H = s.hidden, F = s.expert_ffn;
  for (int64_t e = 0; e < count; ++e) {
    const int64_t b = seg[e], n = seg[e + 1] - b;
    if (n == 0) continue;
    kernels::linear_forward(y + b * 2 * F, xs + b * H,
                            kernels::matmul_weight(low, p.fc1 + e * 2 * F * H), nullptr, n, H,
                            2 * F, scratch, kSegmentGemm);
    kernels::swiglu_forward(act + b * F, y + b * 2 * F, n, F);
    kernels::linear_forward(ys + b * H, act + b * F, kernels::matmul_weight(low, p.fc2 + e * H * F),
                            nullptr, n, F, H, scratch, kSegmentGemm);
  }
}

void experts_backward(float* dxs, float* dy, float* dact, const ZayaMoeParams& g, const float* dys,
                      const float* xs, const float* y, const float* act, const int64_t* seg,
                      int64_t count, const ZayaMoeShape& s, const ZayaMoeParams& p,
                      const kernels::Bf16Weights* low, kernels::Bf16Scratch* scratch) {
  const int64_t H = s.hidden, F = s.expert_ffn, rows = seg[count] - seg[0];
  std::fill(dact + seg[0] * F, dact + (seg[0] + rows) * F, 0.0f);
  std::fill(dy + seg[0] * 2 * F, dy + (seg[0] + rows) * 2 * F, 0.0f);
  for (int64_t e = 0; e < count; ++e) {
    const int64_t b = seg[e], n = seg[e + 1] - b;
    if (n == 0) continue;
    kernels::linear_backward(dact + b * F, g.fc2 + e * H * F, nullptr, dys + b * H, act + b * F,
                             kernels::matmul_weight(low, p.fc2 + e * H * F), n, F, H, scratch,
                             kSegmentGemm);
    kernels::swiglu_backward(dy + b * 2 * F, dact + b * F, y + b * 2 * F, n, F);
    kernels::linear_backward(dxs + b * H, g.fc1 + e * 2 * F * H, nullptr, dy + b * 2 * F,
                             xs + b * H, kernels::matmul_weight(low, p.fc1 + e * 2 * F * H), n, H,
                             2 * F, scratch, kSegmentGemm);
  }
}

ZayaMoeLayer::ZayaMoeLayer(ZayaMoeShape shape, int64_t N, RouterLossCoefs losses,
                           std::shared_ptr<Scratch> scratch)
    : s_(shape),
      losses_(losses),
      N_(N),
      back_(scratch ? std::move(scratch) : std::make_shared<Scratch>()) {
  const int64_t R = s_.router_dim, K = s_.experts + 1, H = s_.hidden, F = s_.expert_ffn;
  const int64_t A = N * s_.top_k;  // assignments
  auto sized = [](std::vector<float>& v, int64_t n) { v.assign(static_cast<size_t>(n), 0.0f); };
  for (auto* v : {&h_, &z0_, &a1_, &z1_, &a2_, &z2_}) sized(*v, N * R);
  sized(rstd_, N);
  sized(logits_, N * K);
  sized(probs_, N * K);
  sized(gate_, A);
  choice_.assign(static_cast<size_t>(A), 0);
  order_.assign(static_cast<size_t>(A), 0);
  slot_.assign(static_cast<size_t>(A), 0);
  offsets_.assign(static_cast<size_t>(s_.experts + 1), 0);
  sized(xs_, A * H);
  sized(ys_, A * H);
  experts_ = std::make_unique<LocalExperts>(s_, A);
  // Backward scratch at its largest (every assignment dispatched).
  auto at_least = [](std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.assign(static_cast<size_t>(n), 0.0f);
  };
  Scratch& b = *back_;
  at_least(b.dys, A * H);
  at_least(b.dgate, A);
  at_least(b.dact, A * F);
  at_least(b.dy, A * 2 * F);
  at_least(b.dxs, A * H);
  at_least(b.dlogits, N * K);
  for (auto* v : {&b.d2, &b.d1, &b.dh, &b.da}) at_least(*v, N * R);
}

size_t ZayaMoeLayer::Scratch::bytes() const {
  size_t n = 0;
  for (const auto* v : {&dys, &dgate, &dact, &dy, &dxs, &dlogits, &d2, &d1, &dh, &da}) {
    n += v->size();
  }
  return n * sizeof(float);
}

size_t ZayaMoeLayer::bytes() const {
  size_t n = 0;
  for (const auto* v :
       {&h_, &rstd_, &z0_, &a1_, &z1_, &a2_, &z2_, &logits_, &probs_, &gate_, &xs_, &ys_}) {
    n += v->size() * sizeof(float);
  }
  return n + experts_->bytes() + (choice_.size() + order_.size() + slot_.size()) * sizeof(int32_t);
}

void ZayaMoeLayer::forward(float* out, float* rstate_out, const float* x, const float* rstate_prev,
                           const ZayaMoeParams& p, const float* balancing_bias) {
  const int64_t R = s_.router_dim, E = s_.experts, K = E + 1, H = s_.hidden;
  const int64_t k = s_.top_k;
  // Router.
  kernels::linear_forward(h_.data(), x, p.down_w, p.down_b, N_, H, R);
  if (rstate_prev != nullptr) {
    for (int64_t n = 0; n < N_; ++n)
      for (int64_t c = 0; c < R; ++c) h_[n * R + c] += rstate_prev[n * R + c] * p.eda_scale[c];
  }
  std::memcpy(rstate_out, h_.data(), static_cast<size_t>(N_ * R) * sizeof(float));
  kernels::rmsnorm_forward(z0_.data(), rstd_.data(), h_.data(), p.norm_w, N_, R, s_.norm_eps);
  kernels::linear_forward(a1_.data(), z0_.data(), p.mlp0_w, p.mlp0_b, N_, R, R);
  kernels::gelu_erf_forward(z1_.data(), a1_.data(), N_ * R);
  kernels::linear_forward(a2_.data(), z1_.data(), p.mlp2_w, p.mlp2_b, N_, R, R);
  kernels::gelu_erf_forward(z2_.data(), a2_.data(), N_ * R);
  kernels::linear_forward(logits_.data(), z2_.data(), p.mlp4_w, nullptr, N_, R, K);
  kernels::router_select_forward(choice_.data(), gate_.data(), probs_.data(), logits_.data(),
                                 balancing_bias, N_, K, k);
  // Dispatch and experts.
  rows_ =
      kernels::moe_dispatch(order_.data(), offsets_.data(), slot_.data(), choice_.data(), N_, k, E);
  stats_.tokens_per_class.assign(static_cast<size_t>(K), 0);
  for (int64_t e = 0; e < E; ++e) stats_.tokens_per_class[e] = offsets_[e + 1] - offsets_[e];
  stats_.tokens_per_class[E] = N_ * k - rows_;
  const kernels::RouterLosses rl = kernels::router_losses(
      probs_.data(), logits_.data(), stats_.tokens_per_class.data(), losses_.aux, losses_.z, N_, E);
  double margin = 0;
#pragma omp parallel for reduction(+ : margin) schedule(static)
  for (int64_t n = 0; n < N_; ++n) {
    float best = -1e30f, second = -1e30f;
    for (int64_t e = 0; e < K; ++e) {
      const float v = probs_[n * K + e] + balancing_bias[e];
      if (v > best) {
        second = best;
        best = v;
      } else if (v > second) {
        second = v;
      }
    }
    margin += best - second;
  }
  stats_.margin = margin / static_cast<double>(N_);
  stats_.aux_loss = rl.aux;
  stats_.z_loss = rl.z;
  kernels::moe_gather(xs_.data(), x, order_.data(), rows_, k, H);
  experts_->forward(ys_.data(), xs_.data(), offsets_.data(), p);
  kernels::moe_combine_forward(out, ys_.data(), x, gate_.data(), slot_.data(), s_.skip_identity, N_,
                               k, H);
}

void ZayaMoeLayer::backward(float* dx, float* drstate_prev, const ZayaMoeParams& g,
                            const float* dout, const float* drstate_out, const float* x,
                            const float* rstate_prev, const ZayaMoeParams& p, float loss_scale) {
  const int64_t R = s_.router_dim, E = s_.experts, K = E + 1, H = s_.hidden;
  const int64_t k = s_.top_k;
  // Combine, experts, gather.
  // Scratch is sized at construction and cleared here: no per-step allocation.
  auto zeroed = [](std::vector<float>& v, int64_t n) -> float* {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    std::fill(v.begin(), v.begin() + n, 0.0f);
    return v.data();
  };
  float* dys = zeroed(back_->dys, rows_ * H);
  float* dgate = zeroed(back_->dgate, N_ * k);
  kernels::moe_combine_backward(dys, dgate, dx, dout, ys_.data(), x, gate_.data(), slot_.data(),
                                s_.skip_identity, N_, k, H);
  float* dxs = zeroed(back_->dxs, rows_ * H);
  experts_->backward(dxs, g, dys, p, back_->dy, back_->dact);
  kernels::moe_gather_backward(dx, dxs, slot_.data(), N_, k, H);
  // Router: only through the gate.
  float* dlogits = zeroed(back_->dlogits, N_ * K);
  float* d2 = zeroed(back_->d2, N_ * R);
  float* d1 = zeroed(back_->d1, N_ * R);
  float* dh = zeroed(back_->dh, N_ * R);
  float* da = zeroed(back_->da, N_ * R);
  kernels::router_select_backward(dlogits, dgate, choice_.data(), probs_.data(), N_, K, k);
  if (losses_.aux != 0.0f || losses_.z != 0.0f) {
    kernels::router_losses_backward(dlogits, probs_.data(), logits_.data(),
                                    stats_.tokens_per_class.data(), losses_.aux, losses_.z,
                                    loss_scale, N_, E);
  }
  kernels::linear_backward(d2, g.mlp4_w, nullptr, dlogits, z2_.data(), p.mlp4_w, N_, R, K);
  kernels::gelu_erf_backward(da, a2_.data(), d2, N_ * R);
  kernels::linear_backward(d1, g.mlp2_w, g.mlp2_b, da, z1_.data(), p.mlp2_w, N_, R, R);
  std::fill(da, da + N_ * R, 0.0f);
  kernels::gelu_erf_backward(da, a1_.data(), d1, N_ * R);
  std::fill(d2, d2 + N_ * R, 0.0f);  // now dz0
  kernels::linear_backward(d2, g.mlp0_w, g.mlp0_b, da, z0_.data(), p.mlp0_w, N_, R, R);
  kernels::rmsnorm_backward(dh, g.norm_w, d2, h_.data(), p.norm_w, rstd_.data(), N_, R);
  if (drstate_out != nullptr) {
    for (int64_t i = 0; i < N_ * R; ++i) dh[i] += drstate_out[i];
  }
  if (rstate_prev != nullptr) {
    for (int64_t n = 0; n < N_; ++n) {
      for (int64_t c = 0; c < R; ++c) {
        drstate_prev[n * R + c] += dh[n * R + c] * p.eda_scale[c];
      }
    }
    for (int64_t c = 0; c < R; ++c) {
      float s = 0.0f;
      for (int64_t n = 0; n < N_; ++n) s += dh[n * R + c] * rstate_prev[n * R + c];
      g.eda_scale[c] += s;
    }
  }
  kernels::linear_backward(dx, g.down_w, g.down_b, dh, x, p.down_w, N_, H, R);
}

}  // namespace anvil::model
