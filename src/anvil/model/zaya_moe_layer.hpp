// ZAYA1's MoE layer (../shared/ZAYA1.md section 4), training form, top-k
// (k = 1 is ZAYA1's):
//   router: h0 = x Wd^T + bd; h = h0 + rstate_prev * g (EDA; not in the first
//   MoE layer); rstate = h; z = RMSNorm(h); z = GELU(z W0^T + b0);
//   z = GELU(z W1^T + b1); p = softmax(z W2^T) over E experts + skip;
//   choices = the k largest p + balancing_bias; gate_j = p[choice_j];
//   experts: SwiGLU (fc1 -> gate|up halves, fc2), dropless (kernels/moe.hpp);
//   out = sum_j gate_j * E_choice_j(x), with gate * x (or 0) for the skip class.
// Router, dispatch and expert compute are separate kernels (STYLE.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/kernels/layers.hpp"

namespace anvil::model {

struct ZayaMoeShape {
  int64_t hidden = 2048;      // H
  int64_t router_dim = 256;   // R
  int64_t experts = 16;       // E (the skip class is E)
  int64_t expert_ffn = 2048;  // F: fc1 is [2F, H], fc2 [H, F]
  int64_t top_k = 1;          // classes (experts or skip) per token
  float norm_eps = 1e-5f;
  bool skip_identity = true;  // skip output gate * x (the original) or 0 (later ports)
};

// Pointers into the parameter (or gradient) arena, PyTorch layouts.
struct ZayaMoeParams {
  float* down_w;     // [R, H]
  float* down_b;     // [R]
  float* eda_scale;  // [R] router_states_scale; null in the first MoE layer
  float* norm_w;     // [R] rmsnorm_eda
  float* mlp0_w;     // [R, R]
  float* mlp0_b;     // [R]
  float* mlp2_w;     // [R, R]
  float* mlp2_b;     // [R]
  float* mlp4_w;     // [E + 1, R]
  float* fc1;        // [E, 2F, H] (expert e at e * 2F * H); under --ep the rank's E/K
  float* fc2;        // [E, H, F]
};

// The token dispatcher and the experts of one MoE layer: rows `xs`
// [rows, H] sorted by expert (offsets [E + 1] into them) in, the experts'
// outputs `ys` [rows, H] out, in the same order. LocalExperts runs every
// expert in this process; the expert-parallel dispatcher
// (parallel/expert_parallel.hpp) sends each expert's rows to the rank holding it
// with an all-to-all and brings the outputs back. The router above and the
// combine below do not change.
class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  virtual void forward(float* ys, const float* xs, const int64_t* offsets,
                       const ZayaMoeParams& p) = 0;
  // Writes d/dxs into dxs (zeroed by the caller) and adds the weight
  // gradients of the experts this process ran to g; dy and dact are scratch.
  virtual void backward(float* dxs, const ZayaMoeParams& g, const float* dys,
                        const ZayaMoeParams& p, std::vector<float>& dy,
                        std::vector<float>& dact) = 0;
  virtual size_t bytes() const = 0;
  // Seconds spent communicating since the last call (0 for local experts).
  virtual double take_comm_seconds() { return 0; }
  // bf16 expert GEMMs (--precision bf16): the weight arena's copy and the
  // model's conversion scratch (sized for the layer's own assignments; a
  // dispatcher that runs other rows keeps its own).
  void set_bf16(const kernels::Bf16Weights* weights, kernels::Bf16Scratch* scratch) {
    low_ = weights;
    low_scratch_ = scratch;
  }

 protected:
  const kernels::Bf16Weights* low_ = nullptr;
  kernels::Bf16Scratch* low_scratch_ = nullptr;
};

// `count` SwiGLU experts on rows grouped by expert: the j-th owns rows
// [seg[j], seg[j + 1]) and its weights are the j-th of p.fc1 / p.fc2 (the
// whole layer's, or under expert parallelism the rank's own block). y
// [rows, 2F] and act [rows, F] are kept for backward. With `low` (bf16) the
// GEMMs take bf16 inputs through `scratch` (rows x max(2F, H) elements).
void experts_forward(float* ys, float* y, float* act, const float* xs, const int64_t* seg,
                     int64_t count, const ZayaMoeShape& s, const ZayaMoeParams& p,
                     const kernels::Bf16Weights* low = nullptr,
                     kernels::Bf16Scratch* scratch = nullptr);
// Adds d/dxs to dxs and the experts' weight gradients to g; dy [rows, 2F] and
// dact [rows, F] are scratch (zeroed here).
void experts_backward(float* dxs, float* dy, float* dact, const ZayaMoeParams& g, const float* dys,
                      const float* xs, const float* y, const float* act, const int64_t* seg,
                      int64_t count, const ZayaMoeShape& s, const ZayaMoeParams& p,
                      const kernels::Bf16Weights* low = nullptr,
                      kernels::Bf16Scratch* scratch = nullptr);
// Elements of the bf16 conversion scratch the experts need for `rows` rows.
int64_t experts_bf16_scratch(const ZayaMoeShape& s, int64_t rows);

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

class ZayaMoeLayer {
 public:
  // Backward scratch, sized for the layer at construction; the MoE layers of
  // one model run their backward passes one at a time and can share one set
  // (`scratch`; null: the layer's own).
  struct Scratch {
    std::vector<float> dys, dgate, dact, dy, dxs, dlogits, d2, d1, dh, da;
    size_t bytes() const;
  };
  ZayaMoeLayer(ZayaMoeShape shape, int64_t N, RouterLossCoefs losses = {},
               std::shared_ptr<Scratch> scratch = nullptr);
  // out [N, H]; rstate_out [N, R] (the pre-norm router state for the next
  // MoE layer); rstate_prev [N, R] or null (first MoE layer). balancing_bias
  // [E + 1] steers selection only.
  void forward(float* out, float* rstate_out, const float* x, const float* rstate_prev,
               const ZayaMoeParams& p, const float* balancing_bias);
  // Adds gradients of sum(out * dout) + sum(rstate_out * drstate_out) to dx,
  // drstate_prev (when rstate_prev was given) and the gradient arena g.
  // loss_scale multiplies the router losses' gradient (the trainer's
  // gradient scale, as dout already carries it).
  void backward(float* dx, float* drstate_prev, const ZayaMoeParams& g, const float* dout,
                const float* drstate_out, const float* x, const float* rstate_prev,
                const ZayaMoeParams& p, float loss_scale = 1.0f);
  const RouterStats& stats() const { return stats_; }
  const std::vector<int32_t>& choices() const { return choice_; }  // [N, top_k]
  // Bytes of the activations this layer holds (its scratch: scratch()).
  size_t bytes() const;
  const std::shared_ptr<Scratch>& scratch() const { return back_; }
  // Replaces the local experts (expert parallelism); the bf16 setting stays.
  void set_dispatcher(std::unique_ptr<ExpertDispatcher> dispatcher) {
    experts_ = std::move(dispatcher);
    experts_->set_bf16(low_, low_scratch_);
  }
  // bf16 expert GEMMs (--precision bf16); the router stays fp32.
  void set_bf16(const kernels::Bf16Weights* weights, kernels::Bf16Scratch* scratch) {
    low_ = weights;
    low_scratch_ = scratch;
    experts_->set_bf16(weights, scratch);
  }
  ExpertDispatcher& dispatcher() { return *experts_; }
  const ZayaMoeShape& shape() const { return s_; }
  // Expert rows per step: N x top_k assignments (skip included), the most
  // the local experts see and what a dispatcher receives when balanced.
  int64_t assignments() const { return N_ * s_.top_k; }

 private:
  ZayaMoeShape s_;
  RouterLossCoefs losses_;
  int64_t N_;
  std::vector<float> h_, rstd_, z0_, a1_, z1_, a2_, z2_, logits_, probs_, gate_;
  std::vector<int32_t> choice_, order_, slot_;
  const kernels::Bf16Weights* low_ = nullptr;
  kernels::Bf16Scratch* low_scratch_ = nullptr;
  std::vector<int64_t> offsets_;
  int64_t rows_ = 0;
  std::vector<float> xs_, ys_;
  std::unique_ptr<ExpertDispatcher> experts_;
  std::shared_ptr<Scratch> back_;
  RouterStats stats_;
};

}  // namespace anvil::model
