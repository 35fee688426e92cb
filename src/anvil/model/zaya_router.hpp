// ZAYA1's router (docs/zaya1-spec.md section 4), training form: from a token's
// hidden state to its top-k classes (E experts + the skip class) and their
// gates. Down projection, exponential depth averaging with the previous MoE
// layer's router state (EDA), RMSNorm, a 3-layer GELU-erf MLP, softmax over
// E + 1, and the k largest p + balancing_bias (the biases steer the choice,
// the gate is the unbiased p). It also counts the tokens per class and
// computes the optional router losses (Switch load balancing, z-loss).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "anvil/model/carver.hpp"
#include "anvil/model/zaya_moe_shape.hpp"

namespace anvil::model {

struct RouterStats {
  std::vector<int64_t> tokens_per_class;  // E + 1 (the last is skip); sums to N * top_k
  double aux_loss = 0, z_loss = 0;        // the optional router losses, as added to the loss
  // Mean over tokens of the gap between the best and the runner-up biased
  // score p_e + bias_e: how far the balancing biases can move before
  // choices flip (compare with the biases' step per optimizer step).
  double margin = 0;
};

// Optional router losses (kernels/zaya.hpp router_losses): Switch
// load-balancing loss and router z-loss coefficients; 0 = off.
struct RouterLossCoefs {
  float aux = 0.0f;
  float z = 0.0f;
};

class ZayaRouter {
 public:
  // Backward scratch: the routers of one model run their backward passes
  // one at a time and share one set.
  struct Scratch {
    float *dlogits, *d2, *d1, *dh, *da;
    void carve(Carver& c, const ZayaMoeShape& s, int64_t tokens);
  };
  ZayaRouter(const ZayaMoeShape& shape, int64_t tokens, RouterLossCoefs losses);
  // Takes the router's activations from `c`; backward uses `shared`.
  void carve(Carver& c, const Scratch& shared);

  // x [N, H]; rstate_out [N, R] gets the pre-norm state for the next MoE
  // layer; rstate_prev [N, R] or null (the first MoE layer); balancing_bias
  // [E + 1].
  void forward(float* rstate_out, const float* x, const float* rstate_prev,
               const ZayaRouterParams& p, const float* balancing_bias);
  // [N, k], best first.
  // [N, k], best first, and their gates.
  std::span<const int32_t> choices() const { return {choice_, static_cast<size_t>(N_ * k())}; }
  const float* gates() const { return gate_; }
  const RouterStats& stats() const { return stats_; }

  // The gradient reaches the router through the gates (dgate [N, k]) and
  // the state passed on (drstate_out, or null); adds to dx, drstate_prev
  // (when rstate_prev was given) and g. loss_scale multiplies the router
  // losses' gradient (the trainer's gradient scale, as dgate carries it).
  void backward(float* dx, float* drstate_prev, const ZayaRouterParams& g, const float* dgate,
                const float* drstate_out, const float* x, const float* rstate_prev,
                const ZayaRouterParams& p, float loss_scale);

 private:
  int64_t k() const { return s_.top_k; }
  // Tokens per class, the router losses and the margin of this forward.
  void measure(const float* balancing_bias);

  ZayaMoeShape s_;
  int64_t N_;
  RouterLossCoefs losses_;
  float *h_ = nullptr, *rstd_ = nullptr, *z0_ = nullptr, *a1_ = nullptr, *z1_ = nullptr,
        *a2_ = nullptr, *z2_ = nullptr, *logits_ = nullptr, *probs_ = nullptr, *gate_ = nullptr;
  int32_t* choice_ = nullptr;
  Scratch back_{};
  RouterStats stats_;
};

}  // namespace anvil::model
