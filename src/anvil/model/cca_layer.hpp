// ZAYA1's CCA attention layer (ZAYA1 paper section 3, CCGQA form),
// forward and backward over a batch [B, S] of rows of width H:
//   u = x [Wq; Wk]^T (qp | kp), v_cur = x_t Wv1^T, v_prev = x_{t-1} Wv2^T,
//   two causal convolutions on u, the q/k mean skip path, L2 norm per head
//   (keys times a learned temperature), partial NeoX RoPE, causal GQA
//   attention with kv head 0 = v_cur and 1 = v_prev, out = o Wo^T.
// The kernels are in kernels/cca.hpp and kernels/layers.hpp; this class lays
// out the layer's activations for one batch shape (carved from the model's
// arena) and strings the kernels together.
// Decode runs one token at a time against a state: the previous token's u
// and D (the two convolutions' older taps), its value projection x Wv2^T,
// and the KV cache (keys after norm, temperature and RoPE; both value heads).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "anvil/kernels/layers.hpp"
#include "anvil/model/carver.hpp"
#include "anvil/model/context_parallel.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::model {

struct CcaShape {
  int64_t hidden = 2048;    // H
  int64_t q_heads = 8;      // Hq
  int64_t kv_heads = 2;     // must be 2: kv head 0 = current token, 1 = previous token
  int64_t head_dim = 128;   // d
  int64_t rotary_dim = 64;  // RoPE on the first rotary_dim channels of each head
  float rope_theta = 10000.0f;
  int64_t q_latent() const { return q_heads * head_dim; }
  int64_t k_latent() const { return kv_heads * head_dim; }
  int64_t channels() const { return q_latent() + k_latent(); }
};

// Pointers into the parameter (or gradient) arena, PyTorch layouts.
struct CcaParams {
  float* wqk;      // [Cq + Ck, H]: linear_q rows then linear_k rows (contiguous)
  float* wv1;      // [d, H] val_proj1 (current token)
  float* wv2;      // [d, H] val_proj2 (previous token)
  float* conv0_w;  // [C, 1, 2]
  float* conv0_b;  // [C]
  float* conv1_w;  // [C, d, 2] (groups of d channels, one per head)
  float* conv1_b;  // [C]
  float* temp;     // [kv_heads] key temperature
  float* wo;       // [H, Cq]
};

class CcaLayer {
 public:
  // Backward scratch: layers of one model run their backward passes one at
  // a time, so they share one set, carved once (carve(Carver&)).
  struct Scratch {
    float *d_att, *d_qkv, *d_qk_pre, *d_u, *d_conv, *d_v;
    void carve(Carver& c, const CcaShape& s, int64_t rows);
  };
  // Holds no memory until carve() (a model's arena) or allocate() (its own).
  // With `cp` split over a context group, the B rows of S are this rank's
  // chunks (S = 2 chunks): the convolutions and the value shift continue
  // each chunk from the rows before it (halos), RoPE takes global
  // positions, and attention runs over the gathered K/V.
  CcaLayer(CcaShape shape, int64_t B, int64_t S, ContextParallel* cp = nullptr);
  // Takes the layer's activations from `c`; backward uses `shared`.
  void carve(Carver& c, const Scratch& shared);
  // An arena of the layer's own with its activations and a backward scratch
  // (a layer outside a model: tests, parity dumps).
  void allocate();
  // out [B*S, H] = CCA(x); keeps what backward needs.
  void forward(float* out, const float* x, const CcaParams& p);
  // Writes the gradient of sum(out * dout) to dx (its old contents unread)
  // and adds the weights' to the gradient arena `g`.
  void backward(float* dx, const CcaParams& g, const float* dout, const float* x,
                const CcaParams& p);

  // Decode: start_decode clears the state for a new sequence of at most
  // max_len tokens; decode_step(out [H], x [H], p, pos) processes the token
  // at position pos (0, 1, 2, ... in order). Needs a layer built for B = S = 1.
  // The state is carved from `c` (counting, then the model's zeroed decode
  // arena).
  void start_decode(int64_t max_len, Carver& c);
  void decode_step(float* out, const float* x, const CcaParams& p, int64_t pos);

  // bf16 projections (--precision bf16) in forward and backward: the weight
  // arena's copy and a conversion scratch of N x max(H, channels) elements;
  // decode stays fp32.
  void set_bf16(const kernels::Bf16Weights* weights, kernels::Bf16Scratch* scratch) {
    low_ = weights;
    low_scratch_ = scratch;
  }
  // Elements of that scratch for a layer of `rows` rows.
  static int64_t bf16_scratch(const CcaShape& s, int64_t rows) {
    return rows * std::max(s.hidden, s.channels());
  }

 private:
  CcaShape s_;
  int64_t B_, S_, N_;
  float *u_ = nullptr, *D_ = nullptr, *conv_ = nullptr, *qk_pre_ = nullptr, *norms_ = nullptr,
        *qkv_ = nullptr, *xv2_ = nullptr, *att_ = nullptr, *lse_ = nullptr;
  Scratch sc_{};  // backward scratch (d_v also the forward's value temp)
  ContextParallel* cp_ = nullptr;  // set when split over a context group
  // Context parallelism's halos per chunk: u's two rows and x_{t-1} Wv2^T's
  // one before it (kept for backward), and their gradients.
  float *u_halo_ = nullptr, *v_halo_ = nullptr, *du_halo_ = nullptr, *dv_halo_ = nullptr;
  void rope(float* x, bool backward) const;
  const kernels::Bf16Weights* low_ = nullptr;
  kernels::Bf16Scratch* low_scratch_ = nullptr;
  kernels::MatmulWeight w(const float* p) const { return kernels::matmul_weight(low_, p); }
  // bf16 tiles with the bf16 projections (kernels::attention_tiles_for).
  kernels::AttentionTiles attention_tiles() const {
    return kernels::attention_tiles_for(low_ != nullptr, s_.head_dim);
  }
  tensor::Arena own_;  // allocate()'s
  // Decode state.
  int64_t max_len_ = 0;
  float *u_prev_ = nullptr, *D_prev_ = nullptr, *xv2_prev_ = nullptr, *kcache_ = nullptr,
        *vcache_ = nullptr;
};

}  // namespace anvil::model
