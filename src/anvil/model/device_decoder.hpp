// The dense decoder (decoder.hpp's GPT-2 and Llama shapes, the same
// registry, so the same checkpoints) with its memory on a device: what
// `anvil train --device cuda` trains. Parameters, gradients and activations
// live in device arenas planned once; the matmuls run on the device's
// GemmEngine (cuBLASLt on CUDA), the other layers through
// kernels/device_layers.hpp, attention unfused (per head, its batch rows as
// one strided-batch GEMM: scores, a causal softmax kernel, then the value
// GEMM; backward recomputes the probabilities), or in bf16 on a GPU fused
// (cuDNN's flash attention, device/fused_attention.hpp). On a CPU device
// the same code runs on the CPU engine and layers, which is how the tests
// check it against Decoder without a GPU.
//
// The trainer's gradient reduction and checkpoints work on host arrays:
// params() and grads() are host copies. A forward uploads the parameters
// when params() was taken mutably since the last upload; forward_backward
// downloads the gradients it accumulated when it ends, unless an optimizer
// steps on the device (device_arrays(), optim/device_adamw.hpp): then the
// gradients stay there, and params() and grads() download when called.
// fp32 (TF32 off by default), or bf16 as Decoder does it: every matmul of
// the linear layers and the classifier on bf16 inputs (a bf16 copy of the
// weights refreshed with each upload, activations and output gradients
// converted into two scratch buffers) with fp32 accumulation and output;
// master weights, gradients, norms, attention and the loss stay fp32.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "anvil/device/fused_attention.hpp"
#include "anvil/device/gemm_engine.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/kernels/device_layers.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/params.hpp"
#include "anvil/model/precision.hpp"
#include "anvil/model/trainable.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::model {

class DeviceDecoder : public TrainableModel {
 public:
  // B x T: the largest micro-batch. `tf32`: the fp32 matmuls (attention's
  // too, in bf16) in TensorFloat-32 on CUDA (ignored on the CPU). InputError for a config the dense
  // family does not build or a sequence past its seq_len; SystemError when the device cannot be
  // used or allocated.
  DeviceDecoder(const ModelConfig& config, int64_t B, int64_t T, bool training,
                device::DeviceKind kind, Precision precision = Precision::fp32, bool tf32 = false);
  ~DeviceDecoder() override;

  // The device memory the model holds (parameters, gradients, activations).
  static MemoryPlan plan_for(const ModelConfig& config, int64_t B, int64_t T, bool training,
                             Precision precision = Precision::fp32, bool fused_attention = false);
  // Whether a model on `kind` in `precision` runs attention fused
  // (device/fused_attention.hpp: bf16 on a GPU where cuDNN's fused
  // attention can run). ANVIL_ATTENTION=unfused keeps the unfused path,
  // =fused requires the fused one (InputError saying why it cannot run).
  static bool fuses_attention(device::DeviceKind kind, Precision precision);
  // Whether a GELU MLP runs its GELU in the up GEMM's epilogue and its slope
  // in the down GEMM's (bias_gelu_aux, dgelu): GELU with biases. Backward
  // then needs no buffer for the activation's output gradient.
  static bool gelu_in_epilogue(const ModelConfig& config) {
    return config.mlp == Mlp::gelu && config.bias;
  }

  const ParamRegistry& registry() const override { return registry_; }
  float* params() override;
  float* params_for_reading() override;
  float* grads() override;
  const MemoryPlan& plan() const override { return plan_; }
  void zero_grads() override;
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 int64_t* scored) override;
  double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale, int64_t* scored) override;
  device::DeviceKind kind() const { return stream_.kind(); }
  const DeviceArrays* device_arrays() const override { return training_ ? &arrays_ : nullptr; }
  void keep_grads_on_device() override { grads_on_device_ = true; }
  void params_written_on_device() override;

  // Decoding, one token at a time (`anvil generate --device cuda`, through
  // DecodingAdapter): start_decode plans a KV cache in device memory for up
  // to `max_len` positions (at most the config's seq_len), then
  // decode_step feeds `token` at `pos` (0, 1, 2, ...) and copies the
  // next-token logits [V] to the host. Decoder::decode_step's arithmetic:
  // each layer's new key and value row appended to its cache, then per
  // key/value head one strided-batch GEMM of its query heads against the
  // cached keys, the softmax of that one query row, and one against the
  // cached values. Build it with B = T = 1, training false, fp32.
  void start_decode(int64_t max_len);
  void decode_step(int32_t token, int64_t pos, float* logits);

 private:
  struct Layer {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *o_w, *o_b, *ln2_w, *ln2_b, *up_w, *up_b, *down_w,
        *down_b;
  };
  struct Acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse, *mid, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fca;
  };
  Layer layer(int64_t l, const float* base) const;
  const float* param(const std::string& name, const float* base) const;
  void check_batch(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) const;
  // The tokens and targets; for a backward on a GPU also the rows grouped
  // by token (the embedding's gradient).
  void upload_batch(const int32_t* tokens, const int32_t* targets, int64_t N, bool backward);
  void upload_params();
  // out[N, OC] = inp[N, IC] W^T (+ bias), W [OC, IC]. With `gelu_input`:
  // out = gelu(inp W^T + bias), and gelu_input = inp W^T + bias, in the
  // GEMM's epilogue (bias required).
  void linear_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N,
                      int64_t IC, int64_t OC, float* gelu_input = nullptr);
  // dinp = dout W (when dinp); dW += dout^T inp; dbias += column sums. With
  // `gelu_input` (the forward's): dinp = (dout W) * gelu'(gelu_input), the
  // gradient through the GELU before this layer, in the GEMM's epilogue.
  void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int64_t N, int64_t IC, int64_t OC,
                       const float* gelu_input = nullptr);
  // fca = act(up(ln2)), fch = up(ln2), the activation's input.
  void mlp_up(const Layer& p, const Acts& a, int64_t N);
  // C = A B (+ beta C) in the fp32 GEMM type (fp32 or tf32), or in bf16
  // when `type` says so (A and B bf16, C fp32).
  // `batch`: that many GEMMs, A, B and C advancing by its strides (elements).
  struct Batch {
    int64_t count, a, b, c;
  };
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
            const void* b, int64_t ldb, float beta, float* c, int64_t ldc, Dtype type,
            Batch batch = {1, 0, 0, 0}, device::Epilogue epilogue = device::Epilogue::none,
            const float* aux = nullptr);
  // The bf16 copy of a weight in the parameter arena (bf16 only).
  const bf16* low(const float* w) const { return weights_bf16_ + (w - dparams_); }
  bool mixed() const { return weights_bf16_ != nullptr; }
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                    const float* b, int64_t N);
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, const float* mean, const float* rstd, int64_t N);
  void rope(float* x, int64_t N, int64_t T, bool backward);
  // The cached cuDNN graphs for B x T (built on first use), or null: no
  // fused attention, or none for this shape (said once on stderr; the
  // unfused attention runs it; under ANVIL_ATTENTION=fused, SystemError).
  device::FusedAttention* fused_attention(int64_t B, int64_t T);
  void attention_forward(const Acts& a, int64_t B, int64_t T);
  void attention_backward(const Acts& a, const float* datt, float* dqkv, int64_t B, int64_t T);
  void run_forward(int64_t B, int64_t T);
  // Classifier and loss over the N rows, chunked; with dx the gradients too.
  // Queues the row losses' copy to the host and records loss_copied_;
  // summed_loss waits for that copy alone (not for work queued after it,
  // such as the backward) and adds the rows.
  void classifier(float* dx, int64_t N, float grad_scale);
  double summed_loss(int64_t N);
  void run_backward(int64_t B, int64_t T);

  ModelConfig config_;
  ParamRegistry registry_;
  MemoryPlan plan_;
  int64_t B_, T_, C_, Hq_, Hkv_, D_, Q_, F_, F2_, V_, L_, rotary_, chunk_;
  bool training_;
  Dtype gemm_type_;
  device::Stream stream_;
  std::unique_ptr<device::GemmEngine> engine_;
  device::DeviceArena params_, grads_, acts_, low_;
  bf16* weights_bf16_ = nullptr;  // bf16 only: the weights' copy and two scratch buffers
  bf16 *scratch_a_ = nullptr, *scratch_b_ = nullptr;
  float *dparams_ = nullptr, *dgrads_ = nullptr;  // the arenas' floats
  // The host copies, in memory the device copies to and from at the link's
  // speed (page-locked on CUDA).
  struct HostFloats {
    device::DeviceBuffer buffer;
    size_t count = 0;
    float* data() const { return buffer.as<float>(); }
    size_t size() const { return count; }
  };
  HostFloats host_params_, host_grads_, host_row_loss_;
  device::Event loss_copied_;
  bool params_stale_ = true;         // the host array is newer: upload before a forward
  bool host_params_behind_ = false;  // the device's are newer: download in params()
  bool grads_on_device_ = false;     // an optimizer steps there: no download after backward
  DeviceArrays arrays_{};
  int32_t *tokens_ = nullptr, *targets_ = nullptr, *groups_ = nullptr;
  kernels::dev::TokenGroups token_groups_;
  float* column_scratch_ = nullptr;  // the GPU's two-stage column sums
  std::vector<float*> x_;
  std::vector<Acts> acts_by_layer_;
  std::vector<Layer> param_layers_, grad_layers_;
  float *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *row_loss_, *scores_, *dscores_;
  float *d_res_, *d_ln_, *d_qkv_, *d_att_, *d_fch_, *d_fca_, *d_lnf_;
  // Fused attention (fuses_attention): bf16 copies of qkv, out, dout and
  // dqkv, and cuDNN's graphs for each micro-batch shape seen.
  bf16 *qkv16_ = nullptr, *out16_ = nullptr, *dout16_ = nullptr, *dqkv16_ = nullptr;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<device::FusedAttention>> fused_by_shape_;
  // Decoding: per layer the keys and values of the positions so far
  // ([max_len, Hkv * D] each), one query row of scores per head and its lse.
  device::DeviceArena cache_;
  std::vector<float*> kcache_, vcache_;
  float *decode_scores_ = nullptr, *decode_lse_ = nullptr;
  int64_t cache_len_ = 0;
};

}  // namespace anvil::model
