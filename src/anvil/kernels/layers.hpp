// The layers of a decoder as free forward/backward pairs over contiguous fp32
// memory, in llm.c's shape: X_forward(out, ..., inp, params, sizes) and
// X_backward(dinp, dparams, dout, ..., inp, params, sizes). Backward
// ACCUMULATES (+=) into every gradient it writes, so callers zero gradient
// buffers once per step and several consumers of one tensor just add up.
// Rows are tokens: N = B*T rows of C features, row-major.
// Each kernel is OpenMP-parallel over rows (or heads) with a static schedule,
// so results are bit-identical from run to run on the same thread count.
#pragma once

#include <cstdint>
#include <string>

#include "anvil/base/bf16.hpp"
#include "anvil/device/gemm.hpp"

namespace anvil::kernels {

// A matrix-multiply weight: fp32, and optionally its bf16 copy. With the copy
// (mixed precision) the GEMM takes bf16 inputs — the activation side is
// converted into Bf16Scratch on the fly — and accumulates in fp32; gradients
// stay fp32. Without it everything is fp32.
struct MatmulWeight {
  MatmulWeight(const float* w) : f32(w) {}  // NOLINT: fp32 is the plain case
  MatmulWeight(const float* w, const bf16* low) : f32(w), bf16_copy(low) {}
  const float* f32;
  const bf16* bf16_copy = nullptr;
};
// A weight arena and its bf16 copy, for layers that hold pointers into the
// fp32 arena (ZAYA1's): weight(w) pairs w with the copy's element at the same
// offset; without a copy (fp32) it is w alone.
struct Bf16Weights {
  const float* f32 = nullptr;
  const bf16* copy = nullptr;
  MatmulWeight weight(const float* w) const {
    return copy == nullptr ? MatmulWeight(w) : MatmulWeight(w, copy + (w - f32));
  }
};
// w as a GEMM weight under `low` (null: fp32).
inline MatmulWeight matmul_weight(const Bf16Weights* low, const float* w) {
  return low == nullptr ? MatmulWeight(w) : low->weight(w);
}
struct Bf16Scratch {
  bf16* a = nullptr;     // the converted input rows
  bf16* b = nullptr;     // the converted output gradient rows
  int64_t capacity = 0;  // elements in each
};

// dst = bf16(src), round to nearest even; vectorised with AVX512_BF16 where built for it.
void convert_to_bf16(bf16* dst, const float* src, int64_t n);

// ---- embedding: out[n, :] = wte[tok[n], :] (+ wpe[n % T, :] when wpe) ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C);

// ---- LayerNorm (weight, bias) and RMSNorm (weight only) over the last axis ----
// mean/rstd: per-row statistics saved for backward (mean unused by RMSNorm).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C);

// ---- linear: out[N, OC] = inp[N, IC] W^T (+ bias), W is [OC, IC] (PyTorch layout) ----
// `scratch` is needed only when the weight has a bf16 copy.
// `backend` picks the GEMM backend (device/gemm.hpp); callers whose row
// count N changes every call (MoE expert segments) pass openblas, as oneDNN
// builds and caches a primitive per exact shape.
void linear_forward(float* out, const float* inp, MatmulWeight weight, const float* bias, int64_t N,
                    int64_t IC, int64_t OC, Bf16Scratch* scratch = nullptr,
                    device::GemmBackend backend = device::GemmBackend::automatic);
// How a backward stores its gradients: added to what the output buffers
// hold (a weight or input used more than once sums its uses), or written
// over them where this call alone produces them (no zeroing pass first, and
// the GEMMs do not read the old values). Both give the same values (a
// zero's sign aside: adding -0 to a cleared buffer leaves +0).
// write_input: the input's gradient written (a fresh buffer of this call),
// the weight's added (weights sum over micro-batches).
enum class GradStore { add, write, write_input };
// dinp may be null (first layer); dbias may be null (no bias). `store`
// applies to dinp and dweight as above; dbias is always added to.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     MatmulWeight weight, int64_t N, int64_t IC, int64_t OC,
                     Bf16Scratch* scratch = nullptr,
                     device::GemmBackend backend = device::GemmBackend::automatic,
                     GradStore store = GradStore::add);

// ---- activations ----
// GELU, tanh approximation (GPT-2's "gelu_new").
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                   GradStore store = GradStore::add);
// SwiGLU: inp rows are [gate (F) | up (F)]; out[n, f] = silu(gate) * up.
void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F);
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F,
                     GradStore store = GradStore::add);

// ---- residual: out = a + b ----
void residual_forward(float* out, const float* a, const float* b, int64_t n);

// ---- zeroing and row copies, split over the threads ----
// A serial memset of a layer's gradient scratch leaves every other core
// waiting at the next parallel region; above kParallelBytes these split the
// work in contiguous static blocks (below it the fork costs more than it saves).
inline constexpr int64_t kParallelBytes = 256 * 1024;
// dst[0, n) = 0.
void zero(float* dst, int64_t n);
void zero_bytes(void* dst, int64_t bytes);
// dst row r (`dst_stride` floats apart) = the first `cols` floats of src row
// r (`src_stride` apart), r in [0, rows).
void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
               int64_t cols);

// ---- RoPE, NeoX (rotate-half) layout, on the first `rotary_dim` dims of each head ----
// x rows hold `n_heads` heads of `head_dim`; `row_stride` floats between rows;
// position of row n is n % T (+ pos0 for decode). In place; backward rotates
// the gradient by the inverse angle (also in place).
void rope_forward(float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride, float theta);
void rope_backward(float* dx, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                   int64_t rotary_dim, int64_t row_stride, float theta);

// ---- causal attention, GQA, computed row by row with an online softmax ----
// qkv rows are [q (Hq*D) | k (Hkv*D) | v (Hkv*D)]; out rows are Hq*D.
// lse[b, h, t] (log-sum-exp of the scaled scores) is saved for backward,
// which recomputes the probabilities as flash attention does: no T x T matrix
// is ever stored. attention_backward writes every entry of dqkv (it does
// not add to it).
//
// The products of the [128 x D] query/key tiles run on the register-blocked
// tile kernel (tile_gemm.hpp) or on single-threaded BLAS calls:
// AttentionTiles::automatic takes attention_tiles(). Both give the same
// results to rounding. AttentionTiles::bf16 runs every product on the
// AVX512_BF16 tile kernel (tile_gemm_bf16) with its inputs rounded to bf16
// and fp32 sums (softmax and statistics in fp32): the bf16 matmul mode's
// attention, where attention_tiles_for picks it.
enum class AttentionTiles { automatic, kernel, blas, bf16 };
// The process's choice, made once: ANVIL_ATTENTION_TILES=kernel|blas|auto
// (unset: auto); auto is the tile kernel where the build has its AVX-512
// form (measured faster, docs/kernels.md), else BLAS. "kernel" on a build
// without a tile kernel is an InputError.
AttentionTiles attention_tiles();
// Whether bf16 runs take the bf16 tiles, the process's choice made once:
// ANVIL_BF16_ATTENTION=tiles|fp32|auto (unset: auto). They need AVX512_BF16,
// the native bf16 GEMM path and the tile kernel ("tiles" without them is an
// InputError); auto takes them where they were measured faster than the
// fp32 tile kernel (AMD Zen 4 and 5; not the Intel Xeon with AMX).
bool bf16_attention_tiles();
// The tiles of a layer's attention: bf16 where its matmuls are bf16,
// bf16_attention_tiles() and the head size D is a multiple of 16; automatic
// otherwise (so ANVIL_ATTENTION_TILES=blas and ANVIL_BF16=emulated keep
// attention fp32).
AttentionTiles attention_tiles_for(bool bf16_matmuls, int64_t D);
// "tile kernel (AVX-512, 6 x 64 register tile)" or "BLAS (OpenBLAS, single-threaded per tile)".
std::string attention_tiles_description(AttentionTiles tiles);
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t Hq,
                       int64_t Hkv, int64_t D, AttentionTiles tiles = AttentionTiles::automatic);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                        AttentionTiles tiles = AttentionTiles::automatic);
// The same attention over strided views, for context parallelism: per
// batch row b the queries at global positions [q0, q0 + Tq) (rows q_row
// apart, batch rows q_batch apart; head h at h*D) attend keys and values
// [0, q0 + Tq) (kv head g at g*D); out has the queries' rows (out_row /
// out_batch) and lse is [B][Hq][Tq]. Key blocks sit at global multiples of
// 128, so a view of a whole sequence computes exactly what the packed
// calls above compute, and a chunk whose start is a multiple of 128 computes
// exactly its rows of them.
struct AttentionView {
  int64_t B = 1, Tq = 0, q0 = 0, Hq = 1, Hkv = 1, D = 1;
  const float* q = nullptr;
  int64_t q_row = 0, q_batch = 0;
  const float *k = nullptr, *v = nullptr;
  int64_t kv_row = 0, kv_batch = 0;
  float* out = nullptr;
  int64_t out_row = 0, out_batch = 0;
  float* lse = nullptr;
};
// Backward's outputs: dq rows like q (written), dk/dv rows like k/v over
// [0, q0 + Tq): written, or added to with accumulate_kv (several query
// chunks against one key buffer; rows past q0 + Tq are not touched).
struct AttentionGrads {
  float* dq = nullptr;
  int64_t dq_row = 0, dq_batch = 0;
  float *dk = nullptr, *dv = nullptr;
  int64_t dkv_row = 0, dkv_batch = 0;
  bool accumulate_kv = false;
};
void attention_forward(const AttentionView& view,
                       AttentionTiles tiles = AttentionTiles::automatic);
// dout has the view's out layout.
void attention_backward(const AttentionView& view, const float* dout, const AttentionGrads& grads,
                        AttentionTiles tiles = AttentionTiles::automatic);
// One query row per head against a KV cache of `len` positions (decode).
// q: [Hq*D]; kcache/vcache: [len, Hkv*D]; out: [Hq*D].
void attention_decode(float* out, const float* q, const float* kcache, const float* vcache,
                      int64_t len, int64_t Hq, int64_t Hkv, int64_t D);

// ---- fused classifier + softmax cross-entropy, chunked over rows ----
// logits = x W^T for W [V, C]; loss = mean over rows with target >= 0 of
// -log softmax(logits)[target]. The V-wide logits exist for `chunk` rows at a
// time (scratch: chunk * V floats). When dx is non-null the gradient of the
// mean loss is produced in the same pass: dx += dlogits W, dW += dlogits^T x.
// Returns the summed loss (not the mean) and writes the count of scored rows.
// Rows of the classifier a caller should hand classifier_loss at once: bounds
// the V-wide scratch (kClassifierChunk x V floats).
constexpr int64_t kClassifierChunk = 256;
// bf16: the chunks whose weight gradient is one GEMM, and the rows that makes
// for N rows in chunks of `chunk` (the bf16 scratch holds that many rows of
// x and of dlogits: rows x max(C, V) elements each).
constexpr int64_t kClassifierWgradChunks = 4;
constexpr int64_t classifier_wgrad_rows(int64_t chunk, int64_t N) {
  return chunk * kClassifierWgradChunks < N ? chunk * kClassifierWgradChunks : N;
}
double classifier_loss(float* dx, float* dweight, const float* x, MatmulWeight weight,
                       const int32_t* targets, int64_t N, int64_t C, int64_t V, float* scratch,
                       int64_t chunk, int64_t* scored, float grad_scale,
                       Bf16Scratch* low = nullptr);

}  // namespace anvil::kernels
