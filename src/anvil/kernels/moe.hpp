// Dropless mixture-of-experts plumbing (docs/zaya1-spec.md section 4, Megatron's
// "token dispatcher"): assignments (token n, choice j of its top-k) are
// sorted stably by expert into contiguous segments, the expert MLPs run on
// the segments (grouped GEMM over the segments), and outputs are combined
// back per token, gate-weighted. No token is dropped and nothing is padded to
// a capacity. Choice E (= the router's skip class) is not dispatched: its
// output is gate * x (or 0). The MoE layer (model/zaya_moe_layer.hpp) uses
// these as its dispatcher's sort and gather and as its combine.
#pragma once

#include <cstdint>

namespace anvil::kernels {

// choice [N*k]: expert per assignment (E = skip). Writes order [rows]
// (assignment index a = n*k + j of each dispatched row, by expert, stable),
// offsets [E + 1] (segment e is rows offsets[e]..offsets[e+1]), slot [N*k]
// (the row of each assignment, -1 for skip). Returns the dispatched rows.
int64_t moe_dispatch(int32_t* order, int64_t* offsets, int32_t* slot, const int32_t* choice,
                     int64_t N, int64_t k, int64_t E);

// xs[i] = x[order[i] / k] (rows of C).
void moe_gather(float* xs, const float* x, const int32_t* order, int64_t rows, int64_t k,
                int64_t C);
// dx[n] += sum over n's dispatched assignments of dxs[slot]; per token, so no races.
void moe_gather_backward(float* dx, const float* dxs, const int32_t* slot, int64_t N, int64_t k,
                         int64_t C);

// out[n] = sum_j gate[n*k+j] * (slot >= 0 ? ys[slot] : (skip_identity ? x[n] : 0)).
void moe_combine_forward(float* out, const float* ys, const float* x, const float* gate,
                         const int32_t* slot, bool skip_identity, int64_t N, int64_t k, int64_t C);
// dys[slot] = gate * dout[n] (written, each row once); dgate[a] += dout[n] . (ys or x);
// dx[n] += gate * dout[n] for identity skips.
void moe_combine_backward(float* dys, float* dgate, float* dx, const float* dout, const float* ys,
                          const float* x, const float* gate, const int32_t* slot,
                          bool skip_identity, int64_t N, int64_t k, int64_t C);

}  // namespace anvil::kernels
