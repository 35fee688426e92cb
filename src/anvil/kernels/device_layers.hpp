// The dense layers on either device: each call takes the device::Stream
// its memory belongs to and runs the CPU layer (layers.hpp, or a loop here)
// on a CPU stream or the CUDA kernel (gpu_layers.hpp) on a CUDA stream.
// model::DeviceDecoder is written against these and device::GemmEngine
// only, so the same orchestration runs in CPU tests and on a GPU.
// Semantics are layers.hpp's: backward calls ADD into the gradients they
// write, rows are tokens, matrices row-major.
//
// Beyond layers.hpp: the column sums of a bias gradient, the causal softmax
// of an unfused attention (scores in memory, one [T, T] block per head) and
// its backward, the per-row cross-entropy over logits in memory, and the
// AdamW and Muon steps' element-wise work.
#pragma once

#include <cstdint>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/kernels/bodies.hpp"

namespace anvil::kernels::dev {

// dst = bf16(src), round to nearest even (the GEMM inputs of mixed precision).
void convert_to_bf16(device::Stream& s, bf16* dst, const float* src, int64_t n);
// dst = float(src), exact (the fused attention's bf16 outputs).
void convert_from_bf16(device::Stream& s, float* dst, const bf16* src, int64_t n);

void embedding_forward(device::Stream& s, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C);
// The rows of a batch grouped by token, for a GPU's embedding backward:
// `packed` holds the distinct tokens ascending (count of them), then count + 1
// offsets, then the row numbers, each token's in order (3 N + 1 ints at most).
struct TokenGroups {
  std::vector<int32_t> packed;
  int64_t count = 0;
};
void group_by_token(const int32_t* tokens, int64_t N, TokenGroups* out);

// dwte[tokens[n]] += dout[n]; dwpe[n % T] += dout[n] (wpe may be null).
// Deterministic: the CPU adds the rows in order; a GPU sums each token's
// rows in order from `groups` (group_by_token's packed ints in device
// memory, `group_count` tokens; the CPU takes null and 0).
void embedding_backward(device::Stream& s, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                        const int32_t* groups, int64_t group_count);

void layernorm_forward(device::Stream& s, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps);
// The parameter gradients' column sums use `scratch` on a GPU (device memory,
// column_sum_scratch(2 * C) floats; the CPU needs none and takes null).
void layernorm_backward(device::Stream& s, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C, float* scratch);
void rmsnorm_forward(device::Stream& s, float* out, float* rstd, const float* inp,
                     const float* weight, int64_t N, int64_t C, float eps);
void rmsnorm_backward(device::Stream& s, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int64_t N,
                      int64_t C, float* scratch);

void gelu_forward(device::Stream& s, float* out, const float* inp, int64_t n);
void gelu_backward(device::Stream& s, float* dinp, const float* inp, const float* dout, int64_t n);
void swiglu_forward(device::Stream& s, float* out, const float* inp, int64_t N, int64_t F);
void swiglu_backward(device::Stream& s, float* dinp, const float* dout, const float* inp, int64_t N,
                     int64_t F);
void residual_forward(device::Stream& s, float* out, const float* a, const float* b, int64_t n);

// RoPE on the heads of rows `row_stride` floats apart (layers.hpp's
// rope_forward), or its backward.
void rope(device::Stream& s, float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads,
          int64_t head_dim, int64_t rotary_dim, int64_t row_stride, float theta, bool backward);

// The floats of scratch a GPU's column sums need for `columns` columns
// (gpu_layers.hpp's two stages).
int64_t column_sum_scratch(int64_t columns);

// dbias[j] += sum over n of dout[n, j]: rows in order on the CPU, in two
// deterministic stages on a GPU (column_sum_scratch(OC) floats of scratch).
void bias_backward(device::Stream& s, float* dbias, const float* dout, int64_t N, int64_t OC,
                   float* scratch);

// `rows` rows of T scores each (keys 0..T-1), blocks of `queries` rows
// (T when 0) stacked (several heads or batch rows): row r is the query at
// position last(r) = T - queries + r % queries, the queries being the last
// ones of the sequence (r % T in training; T - 1 for every row of one
// decoded token against a KV cache, queries = 1). In place: scores[r, j]
// becomes the causal softmax probability of key j <= last(r) of `scale` *
// scores (0 for j after it), and lse[r] the log-sum-exp of the scaled
// scores j <= last(r).
void causal_softmax_forward(device::Stream& s, float* scores, float* lse, int64_t rows, int64_t T,
                            float scale, int64_t queries = 0);
// In place: dprobs (the probabilities' gradient) becomes the raw scores'
// gradient, p (dp - sum_j p_j dp_j) * scale (0 after the diagonal).
void causal_softmax_backward(device::Stream& s, float* dprobs, const float* probs, int64_t rows,
                             int64_t T, float scale);

// Per row of [N, V] logits (gpu_layers.hpp's cross_entropy): row_loss[n] =
// logsumexp - logits[target] (0 for a negative target), and the logits
// replaced by their loss gradient times grad_scale.
void cross_entropy(device::Stream& s, float* logits, float* row_loss, const int32_t* targets,
                   int64_t N, int64_t V, float grad_scale);

// One AdamW step over the pieces (bodies.hpp's adamw with each piece's
// constants), each gradient times grad_scale as it is read. On a GPU one
// launch for all of them (multi-tensor), reading the table from
// `device_table` (room for the pieces, in device memory), which this
// copies `pieces` into first; on the CPU a loop over them.
void adamw(device::Stream& s, float* p, float* m, float* v, const float* g,
           const std::vector<body::AdamWPiece>& pieces, body::AdamWPiece* device_table,
           float grad_scale);

// Muon's element-wise steps (bodies.hpp): buf = mu buf + g x grad_scale and
// u = the update; p = p decay - step u; dst = src x alpha.
void muon_momentum(device::Stream& s, float* buf, float* u, const float* g, int64_t n, float mu,
                   bool nesterov, float grad_scale);
void muon_apply(device::Stream& s, float* p, const float* u, int64_t n, float decay, float step);
void scale(device::Stream& s, float* dst, const float* src, int64_t n, float alpha);

}  // namespace anvil::kernels::dev
