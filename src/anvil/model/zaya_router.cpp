// The ZAYA1 router's forward and backward over buffers carved from the
// model's activation arena; the element-wise parts are in kernels/zaya.
#include "anvil/model/zaya_router.hpp"

#include <cstring>

#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/zaya.hpp"

namespace anvil::model {

ZayaRouter::ZayaRouter(const ZayaMoeShape& shape, int64_t tokens, RouterLossCoefs losses)
    : s_(shape), N_(tokens), losses_(losses) {}

void ZayaRouter::Scratch::carve(Carver& c, const ZayaMoeShape& s, int64_t tokens) {
  dlogits = c.take<float>(tokens * (s.experts + 1));
  for (float** v : {&d2, &d1, &dh, &da}) *v = c.take<float>(tokens * s.router_dim);
}

void ZayaRouter::carve(Carver& c, const Scratch& shared) {
  const int64_t R = s_.router_dim, K = s_.experts + 1;
  for (float** v : {&h_, &z0_, &a1_, &z1_, &a2_, &z2_}) *v = c.take<float>(N_ * R);
  rstd_ = c.take<float>(N_);
  logits_ = c.take<float>(N_ * K);
  probs_ = c.take<float>(N_ * K);
  gate_ = c.take<float>(N_ * k());
  choice_ = c.take<int32_t>(N_ * k());
  back_ = shared;
}

void ZayaRouter::forward(float* rstate_out, const float* x, const float* rstate_prev,
                         const ZayaRouterParams& p, const float* balancing_bias) {
  const int64_t R = s_.router_dim, K = s_.experts + 1, H = s_.hidden;
  kernels::linear_forward(h_, x, p.down_w, p.down_b, N_, H, R);
  if (rstate_prev != nullptr) {
    for (int64_t n = 0; n < N_; ++n)
      for (int64_t c = 0; c < R; ++c) h_[n * R + c] += rstate_prev[n * R + c] * p.eda_scale[c];
  }
  std::memcpy(rstate_out, h_, static_cast<size_t>(N_ * R) * sizeof(float));
  kernels::rmsnorm_forward(z0_, rstd_, h_, p.norm_w, N_, R, s_.norm_eps);
  kernels::linear_forward(a1_, z0_, p.mlp0_w, p.mlp0_b, N_, R, R);
  kernels::gelu_erf_forward(z1_, a1_, N_ * R);
  kernels::linear_forward(a2_, z1_, p.mlp2_w, p.mlp2_b, N_, R, R);
  kernels::gelu_erf_forward(z2_, a2_, N_ * R);
  kernels::linear_forward(logits_, z2_, p.mlp4_w, nullptr, N_, R, K);
  kernels::router_select_forward(choice_, gate_, probs_, logits_, balancing_bias, N_, K, k());
  measure(balancing_bias);
}

void ZayaRouter::measure(const float* balancing_bias) {
  const int64_t E = s_.experts, K = E + 1;
  stats_.tokens_per_class.assign(static_cast<size_t>(K), 0);
  for (int64_t a = 0; a < N_ * k(); ++a) ++stats_.tokens_per_class[choice_[a]];
  const kernels::RouterLosses rl = kernels::router_losses(
      probs_, logits_, stats_.tokens_per_class.data(), losses_.aux, losses_.z, N_, E);
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
}

void ZayaRouter::backward(float* dx, float* drstate_prev, const ZayaRouterParams& g,
                          const float* dgate, const float* drstate_out, const float* x,
                          const float* rstate_prev, const ZayaRouterParams& p, float loss_scale) {
  const int64_t R = s_.router_dim, E = s_.experts, K = E + 1, H = s_.hidden;
  auto zeroed = [](float* v, int64_t n) {
    kernels::zero(v, n);
    return v;
  };
  float* dlogits = zeroed(back_.dlogits, N_ * K);
  float* d2 = zeroed(back_.d2, N_ * R);
  float* d1 = zeroed(back_.d1, N_ * R);
  float* dh = zeroed(back_.dh, N_ * R);
  float* da = zeroed(back_.da, N_ * R);
  kernels::router_select_backward(dlogits, dgate, choice_, probs_, N_, K, k());
  if (losses_.aux != 0.0f || losses_.z != 0.0f) {
    kernels::router_losses_backward(dlogits, probs_, logits_, stats_.tokens_per_class.data(),
                                    losses_.aux, losses_.z, loss_scale, N_, E);
  }
  kernels::linear_backward(d2, g.mlp4_w, nullptr, dlogits, z2_, p.mlp4_w, N_, R, K);
  kernels::gelu_erf_backward(da, a2_, d2, N_ * R);
  kernels::linear_backward(d1, g.mlp2_w, g.mlp2_b, da, z1_, p.mlp2_w, N_, R, R);
  kernels::zero(da, N_ * R);
  kernels::gelu_erf_backward(da, a1_, d1, N_ * R);
  kernels::zero(d2, N_ * R);  // now dz0
  kernels::linear_backward(d2, g.mlp0_w, g.mlp0_b, da, z0_, p.mlp0_w, N_, R, R);
  kernels::rmsnorm_backward(dh, g.norm_w, d2, h_, p.norm_w, rstd_, N_, R);
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
