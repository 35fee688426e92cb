// Causal scaled-dot-product attention fused into one kernel per pass (flash
// attention: the T x T scores never reach memory), for the GPU decoder's bf16
// path. On CUDA it is cuDNN's SDPA through the cuDNN frontend's graph API
// (cudnn_attention.cpp; cuDNN loaded at run time, like cuBLASLt and NCCL), one
// forward and one backward graph per shape, built once and cached; a HIP build
// would put AOTriton or CK's flash attention behind the same class.
//
// The tensors stay in the decoder's layout, described to cuDNN by strides
// (attention_layout): qkv rows [B*T, (Hq + 2 Hkv) * D] holding each position's
// query heads, then key heads, then value heads; out rows [B*T, Hq * D]; and
// the statistics (each query's log-sum-exp of its scaled scores, fp32) as
// [B][Hq][T] (the unfused path's lse is [Hq][B*T]: each path reads only
// what it wrote itself). Query head h reads key/value head
// h / (Hq / Hkv) (GQA). qkv, out, their gradients: bf16; statistics: fp32.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "anvil/base/bf16.hpp"
#include "anvil/device/runtime.hpp"

namespace anvil::device {

struct AttentionShape {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 1.0f;  // applied to the scores before the softmax
};

// One tensor as [batch, head, position, dim] dims and element strides, its
// first element `offset` elements into its buffer.
struct AttentionTensor {
  std::array<int64_t, 4> dims{}, strides{};
  int64_t offset = 0;
};
struct AttentionLayout {
  AttentionTensor q, k, v, out, stats;  // q, k, v in qkv (dq, dk, dv alike); stats dim 1
};
// The layout above for `shape` (InputError for a shape GQA cannot group).
AttentionLayout attention_layout(const AttentionShape& shape);

// Device memory a FusedAttention of `shape` may ask for as its workspace,
// an upper bound for planning (the exact figure is known only once cuDNN
// has built the graphs: FusedAttention::workspace_bytes). The deterministic
// backward's dP buffer (bf16, B x Hq x T x T with T rounded up to 64 and
// 128), cuDNN's softmax sums, an fp32 dQ accumulator and, with GQA, the
// per-query-head dK and dV it reduces.
size_t fused_attention_workspace_bound(const AttentionShape& shape);

// Empty when fused attention can run here; else why not (not built with
// CUDA or the cuDNN frontend, cuDNN not loadable, no GPU, a GPU before sm_80).
std::string fused_attention_unavailable();

class FusedAttention {
 public:
  // Builds both graphs for `shape` on the current GPU, to run on `stream`;
  // SystemError when cuDNN has no plan for it (fused_attention_unavailable()
  // first).
  FusedAttention(const AttentionShape& shape, Stream& stream);
  ~FusedAttention();
  FusedAttention(const FusedAttention&) = delete;
  FusedAttention& operator=(const FusedAttention&) = delete;

  // out = softmax(scale * Q K^T, causal) V per head; stats as above.
  void forward(const bf16* qkv, bf16* out, float* stats);
  // dqkv (all of it written) from the forward's qkv, out and stats and dout.
  void backward(const bf16* qkv, const bf16* out, const bf16* dout, const float* stats, bf16* dqkv);
  // The device workspace both graphs share.
  size_t workspace_bytes() const;

 private:
  struct Graphs;
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace anvil::device
