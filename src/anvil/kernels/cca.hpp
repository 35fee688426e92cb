// The pieces of ZAYA1's CCA attention that ordinary attention does not have
// (docs/zaya1-spec.md section 3), as forward/backward pairs over rows of
// N = B*S tokens; backward accumulates (+=) like every kernel in layers.hpp.
// The layer that strings them together (projections, values, RoPE,
// attention, output) is model/cca_layer.hpp.
#pragma once

#include <cstdint>

namespace anvil::kernels {

// The two causal convolutions over time on u [N, C] (C = Cq + Ck channels,
// per-sequence time axis of length S), both kernel 2:
//   D_t[c]    = w0[c,0] u_{t-1}[c] + w0[c,1] u_t[c] + b0[c]      (t >= -1, u_{<0} = 0,
//                                                                 so D_{-1} = b0)
//   conv_t[c] = sum_j W1[c,j,0] D_{t-1}[gG+j] + W1[c,j,1] D_t[gG+j] + b1[c]
// for c in group G of `group` channels. w0 is [C,1,2], W1 is [C,group,2]
// (PyTorch Conv1d layouts, tap 0 = the older sample). D [N, C] is saved for
// backward.
// `halo` [B, 2, C] (null: none) continues each sequence from rows held
// elsewhere (context parallelism: a chunk of a longer sequence): u_{t0-2}
// and u_{t0-1} of the chunk starting at t0, in place of the zeros.
void cca_conv_forward(float* conv, float* D, const float* u, const float* w0, const float* b0,
                      const float* w1, const float* b1, int64_t B, int64_t S, int64_t C,
                      int64_t group, const float* halo = nullptr);
// dD: scratch of N x C floats (overwritten), so that backward allocates nothing large.
// With a halo, its gradient is added to dhalo [B, 2, C].
void cca_conv_backward(float* du, float* dw0, float* db0, float* dw1, float* db1, float* dD,
                       const float* dconv, const float* u, const float* D, const float* w0,
                       const float* b0, const float* w1, int64_t B, int64_t S, int64_t C,
                       int64_t group, const float* halo = nullptr, float* dhalo = nullptr);

// The q/k mean skip path, per row: with g = Hq / Hkv query heads per key head,
//   qm[h] = (qp[h] + kp[h/g]) / 2,  km[j] = mean_a qm[g j + a],
//   q[h]  = cq[h] + qm[h],          k[j] = ck[j] + km[j].
// qp/kp rows hold Hq*D / Hkv*D (stride qp_stride / kp_stride); conv rows hold
// [cq (Hq*D) | ck (Hkv*D)]; q and k are written to q_out/k_out rows.
void cca_mean_skip_forward(float* q_out, float* k_out, int64_t out_stride, const float* qp,
                           const float* kp, int64_t qk_stride, const float* conv, int64_t N,
                           int64_t Hq, int64_t Hkv, int64_t D);
void cca_mean_skip_backward(float* dqp, float* dkp, float* dconv, const float* dq, const float* dk,
                            int64_t out_stride, int64_t qk_stride, int64_t N, int64_t Hq,
                            int64_t Hkv, int64_t D);

// Per-head L2 normalisation to length sqrt(D), times temp[h] when temp is
// non-null: y = x sqrt(D) / ||x|| (* temp[h]), over rows of `heads` heads
// (row stride `stride`, y may not alias x); `norms` [N * heads] keeps ||x||
// for backward. dtemp may be null (no temperature).
void l2norm_heads_forward(float* y, float* norms, const float* x, const float* temp, int64_t N,
                          int64_t heads, int64_t D, int64_t stride);
void l2norm_heads_backward(float* dx, float* dtemp, const float* dy, const float* x,
                           const float* norms, const float* temp, int64_t N, int64_t heads,
                           int64_t D, int64_t stride);

}  // namespace anvil::kernels
