// ZAYA1's residual scaling and the router's element-wise parts
// (docs/zaya1-spec.md sections 4 and 5), as forward/backward pairs over rows;
// backward accumulates (+=) unless told to write.
#pragma once

#include <cstdint>

#include "anvil/kernels/layers.hpp"

namespace anvil::kernels {

// merge(r, h) = (h + hb) * hs + (r + rb) * rs per channel (C wide rows).
// r == nullptr: the first merge, (h + hb) * hs only (rs, rb unused).
void residual_merge_forward(float* out, const float* r, const float* h, const float* hs,
                            const float* hb, const float* rs, const float* rb, int64_t N,
                            int64_t C);
// dr/drs/drb are skipped when r is null. `store` applies to dr and dh
// (write_input: written, not added to); the scales' and biases' gradients
// are always added to.
void residual_merge_backward(float* dr, float* dh, float* dhs, float* dhb, float* drs, float* drb,
                             const float* dout, const float* r, const float* h, const float* hs,
                             const float* hb, const float* rs, const float* rb, int64_t N,
                             int64_t C, GradStore store = GradStore::add);

// GELU with the exact erf (the router MLP's activation): x * Phi(x).
void gelu_erf_forward(float* out, const float* inp, int64_t n);
void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// Router selection over E + 1 classes (index E = skip): p = softmax(logits);
// the k classes with the largest p_e + bias_e (the bias steers selection
// only), best first, ties to the lower index as torch.topk/argmax; gate =
// p[choice] (unbiased, not renormalised). choice and gate are [N, k]; probs
// [N, E+1] is saved. k = 1 is ZAYA1's argmax.
void router_select_forward(int32_t* choice, float* gate, float* probs, const float* logits,
                           const float* bias, int64_t N, int64_t classes, int64_t k = 1);
// The gradient reaches the logits only through the gates:
// dlogits[n, e] += sum_j dgate[n, j] p_cj (1[e == cj] - p_e), cj = choice[n, j].
void router_select_backward(float* dlogits, const float* dgate, const int32_t* choice,
                            const float* probs, int64_t N, int64_t classes, int64_t k = 1);

// Optional router losses on the E experts (not the skip class), for
// probs/logits [N, E+1] and the tokens routed to each expert this step:
//   Switch load-balancing loss  aux = coef_aux * E * sum_e f_e P_e, with
//     f_e = tokens_per_expert[e] / N (a constant) and P_e = mean_n p[n, e];
//   router z-loss  z = coef_z * mean_n logsumexp(logits[n])^2.
// router_losses returns both; the backward adds scale x their gradient
// with respect to the logits to dlogits.
struct RouterLosses {
  double aux = 0, z = 0;
};
RouterLosses router_losses(const float* probs, const float* logits,
                           const int64_t* tokens_per_expert, float coef_aux, float coef_z,
                           int64_t N, int64_t E);
void router_losses_backward(float* dlogits, const float* probs, const float* logits,
                            const int64_t* tokens_per_expert, float coef_aux, float coef_z,
                            float scale, int64_t N, int64_t E);

}  // namespace anvil::kernels
