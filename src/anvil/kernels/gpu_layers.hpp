// The dense layers' element-wise and per-row kernels on CUDA: the GPU side
// of layers.hpp's embedding, norms, activations, residual and RoPE, the
// classifier's cross-entropy over logits already in device memory, and the
// AdamW update. Their arithmetic is bodies.hpp's (shared with the CPU
// layers, tested on the CPU); row reductions are one thread block per row,
// halving over shared memory. Every pointer is device memory; `stream` is
// the device::Stream's native() handle (a cudaStream_t). The layouts are
// layers.hpp's. A build without CUDA compiles gpu_layers_absent.cpp, where
// every call throws with the reason.
#pragma once

#include <cstdint>

#include "anvil/kernels/bodies.hpp"

namespace anvil::kernels::gpu {

// dst[i] = the bf16 bits of src[i], round to nearest even (NaN stays NaN),
// as base/bf16.hpp's to_bf16.
void convert_to_bf16(uint16_t* dst, const float* src, int64_t n, void* stream);
// dst[i] = the float whose top 16 bits are src[i] (exact).
void convert_from_bf16(float* dst, const uint16_t* src, int64_t n, void* stream);

// out[n, :] = wte[tokens[n], :] + wpe[n % T, :] (wpe may be null).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t N, int64_t T, int64_t C, void* stream);

// dwte[tokens[n], :] += dout[n, :]; dwpe[n % T, :] += dout[n, :] (wpe may
// be null), deterministic and parallel: the rows come grouped by token
// (`groups`, device_layers.hpp's group_by_token layout: the distinct
// tokens, then their offsets, then the rows in order), a block per token
// and 256 columns sums its rows in order; a thread per position and column
// sums its batch rows in order.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* groups,
                        int64_t group_count, int64_t N, int64_t T, int64_t C, void* stream);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps, void* stream);
// dinp += the input gradient; dweight, dbias += the parameter gradients,
// column sums in two deterministic stages (column_sum_scratch(2 * C) floats
// of `scratch`).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C, float* scratch, void* stream);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps, void* stream);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C, float* scratch,
                      void* stream);

void gelu_forward(float* out, const float* inp, int64_t n, void* stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, void* stream);
void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F, void* stream);
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F,
                     void* stream);
void residual_forward(float* out, const float* a, const float* b, int64_t n, void* stream);

// Column sums over many rows, deterministic and parallel: stage one sums
// chunks of rows (up to kColumnChunks of them, each a block of 32 columns by
// 8 row lanes combined in order) into `scratch`, stage two adds a column's
// chunks in order. column_sum_scratch(columns): the floats of scratch for
// that many summed columns.
constexpr int64_t kColumnChunks = 64;
inline int64_t column_sum_scratch(int64_t columns) {
  return kColumnChunks * columns;
}
// dbias[j] += the column sum of dout [N, OC] (column_sum_scratch(OC) floats of scratch).
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t OC, float* scratch,
                   void* stream);

// device_layers.hpp's causal softmax over stacked [T]-wide score rows (row r
// is query position T - queries + r % queries), in place, and its backward
// (queries = T: position r % T).
void causal_softmax_forward(float* scores, float* lse, int64_t rows, int64_t T, int64_t queries,
                            float scale, void* stream);
void causal_softmax_backward(float* dprobs, const float* probs, int64_t rows, int64_t T,
                             float scale, void* stream);

// In place on rows `row_stride` floats apart; sign -1 for the backward.
void rope_apply(float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                int64_t rotary_dim, int64_t row_stride, float theta, float sign, void* stream);

// Per row of [N, V] logits: row_loss[n] = logsumexp - logits[target] (0 for
// a negative target), and the logits replaced by their loss gradient times
// grad_scale (zero for a negative target).
void cross_entropy(float* logits, float* row_loss, const int32_t* targets, int64_t N, int64_t V,
                   float grad_scale, void* stream);

// One AdamW step over n parameters with the step's constants (bodies.hpp).
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const body::AdamWStep& step, float grad_scale, void* stream);

// The same over `count` pieces in one launch: `pieces` is a device copy of
// the table, grid row y runs piece y (at most 65535 pieces per call), and
// `longest` is the largest piece's n (it sizes the grid's rows).
void adamw_pieces(float* params, float* m, float* v, const float* grads,
                  const body::AdamWPiece* pieces, int64_t count, int64_t longest, float grad_scale,
                  void* stream);

// Muon (bodies.hpp): per element buf = mu buf + g x grad_scale and u = the
// update (Nesterov or not); then p = p decay - step u.
void muon_momentum(float* buf, float* u, const float* g, int64_t n, float mu, bool nesterov,
                   float grad_scale, void* stream);
void muon_apply(float* p, const float* u, int64_t n, float decay, float step, void* stream);
// dst[i] = src[i] x alpha (in place when dst == src).
void scale(float* dst, const float* src, int64_t n, float alpha, void* stream);

// The two passes of the exact gradient norm (optim/square_sum.hpp), into
// device words the caller zeroed. max_abs_bits: the largest |g|'s float bits
// (a NaN's or an infinity's are above every finite one's), maxed into *bits.
// fixed_square_sum: body::fixed_square(g, factor) summed, the low 42 bits'
// sums into sums[0] and the rest in units of 2^42 into sums[1], so that
// sums[1] x 2^42 + sums[0] is the exact integer total in any order.
void max_abs_bits(const float* g, int64_t n, uint32_t* bits, void* stream);

// x = u x body::muon_unit_factor(|u|_F) with no wait on the host: the sum of
// squares in double over kUnitPartials fixed slices (each thread's elements
// in order, then a tree per block), those added in order by one block, the
// factor written to *factor and read by the scaling kernel. The same bits
// for the same u on any GPU; not the host's exact sum (within ~1e-15).
// `partials` holds kUnitPartials doubles.
constexpr int kUnitPartials = 256;
void scale_to_unit_norm(float* x, const float* u, int64_t n, double* partials, float* factor,
                        void* stream);
void fixed_square_sum(const float* g, int64_t n, double factor, unsigned long long* sums,
                      void* stream);

}  // namespace anvil::kernels::gpu
