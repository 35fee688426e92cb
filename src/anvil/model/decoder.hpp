// A dense pre-norm decoder (GPT-2 and Llama families) as explicit forward and
// backward passes over planned memory. The Decoder owns three arenas sized
// from the config and the micro-batch shape before the first step:
// parameters, gradients (when training) and activations. Nothing is
// allocated per step. Parameter names follow Hugging Face (see params.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/kernels/layers.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/context_parallel.hpp"
#include "anvil/model/params.hpp"
#include "anvil/model/precision.hpp"
#include "anvil/model/trainable.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::model {

// Builds the registry of a dense decoder: names, shapes, init, decay flags.
// InputError for a config of CCA attention or with experts.
ParamRegistry decoder_registry(const ModelConfig& config);

// A forward's batch against the planned B x T, and its tokens against the
// vocabulary [0, V): InputError naming the first that is not.
void check_forward_batch(const int32_t* tokens, int64_t B, int64_t T, int64_t planned_B,
                         int64_t planned_T, int64_t V);

class Decoder : public TrainableModel {
 public:
  // B x T: the largest micro-batch forward() will see. training=false skips
  // the gradient arena and the activations backward needs beyond one chunk.
  // With a context group of C ranks, T is the whole sequence and this rank
  // holds B x T/C tokens of it (context_parallel.hpp): forward() then takes
  // exactly those, in the group's chunk order.
  Decoder(const ModelConfig& config, int64_t B, int64_t T, bool training,
          Precision precision = Precision::fp32, ContextGroup* context = nullptr);

  const ModelConfig& config() const { return config_; }
  const ParamRegistry& registry() const override { return registry_; }
  // Mutable access marks the bf16 weight copy stale (refreshed on the next forward).
  float* params() override {
    low_stale_ = true;
    return params_.f();
  }
  float* params_for_reading() override { return params_.f(); }
  Precision precision() const { return precision_; }
  float* grads() override { return grads_.f(); }
  bf16* fresh_bf16_weights() override { return low_stale_ ? nullptr : weights_bf16_; }
  void bf16_weights_refreshed() override { low_stale_ = false; }
  const MemoryPlan& plan() const override { return plan_; }
  static MemoryPlan plan_for(const ModelConfig& config, int64_t B, int64_t T, bool training,
                             Precision precision = Precision::fp32, int context = 1);
  ContextSeconds take_context_seconds() override {
    return {cp_.take_kv_seconds(), cp_.take_halo_seconds()};
  }

  void zero_grads() override;
  // Forward over tokens [B, T]. With targets (-1 = not scored) returns the
  // summed cross-entropy and the scored-row count; when `backward` is set the
  // gradients of (loss_sum * grad_scale) are ADDED to grads() in the same call
  // (the classifier is fused with the loss, see kernels/loss.cpp).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 int64_t* scored) override;
  double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale, int64_t* scored) override;
  // After forward(): the logits [B*T, V] of every row (tests and evaluation).
  void logits(float* out, int64_t B, int64_t T);

  // Decode with a KV cache of up to `max_len` positions; one token at a time.
  void start_decode(int64_t max_len);
  // Feeds `token` at position `pos` (== number of tokens fed so far) and
  // writes the next-token logits [V].
  void decode_step(int32_t token, int64_t pos, float* logits);

 private:
  std::vector<int64_t> layer_begin_;  // registry_.layer_begin(l) per layer (backward's hook)
  struct Layer {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *o_w, *o_b, *ln2_w, *ln2_b, *up_w, *up_b, *down_w,
        *down_b;
  };
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse, *mid, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fca;
  };
  Layer layer(int64_t l, const float* base) const;
  kernels::MatmulWeight matmul_weight(const float* w) const;
  // bf16 tiles with the bf16 matmuls (kernels::attention_tiles_for).
  kernels::AttentionTiles attention_tiles() const {
    return kernels::attention_tiles_for(weights_bf16_ != nullptr, D_);
  }
  void refresh_low_precision();
  // Resolved once at construction (the arenas never move).
  const Layer& layer_params(int64_t l) const { return param_layers_[l]; }
  const Layer& layer_grads(int64_t l) const { return grad_layers_[l]; }
  const float* param(const std::string& name, const float* base) const;
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                    const float* b, int64_t N) const;
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, const float* mean, const float* rstd, int64_t N) const;
  void run_forward(const int32_t* tokens, int64_t B, int64_t T);
  void run_backward(const int32_t* tokens, int64_t B, int64_t T);
  const float* classifier_weight(const float* base) const;
  // RoPE (or its backward) on the q and k heads of qkv rows, at each row's
  // global position.
  void rope(float* x, int64_t N, int64_t T, bool backward) const;

  struct Buffer {
    tensor::Arena arena;
    float* f() const { return reinterpret_cast<float*>(arena.base()); }
  };

  ModelConfig config_;
  ParamRegistry registry_;
  MemoryPlan plan_;
  int64_t B_, T_;
  int64_t C_, Hq_, Hkv_, D_, Q_, F_, F2_, V_, L_, rotary_;
  bool training_;
  Precision precision_;
  tensor::Arena low_;  // bf16 weight copy + conversion scratch
  bf16* weights_bf16_ = nullptr;
  kernels::Bf16Scratch scratch_;
  bool low_stale_ = true;
  Buffer params_, grads_;
  tensor::Arena acts_;
  std::vector<float*> x_;  // residual stream before each layer, and after the last
  std::vector<LayerActs> acts_by_layer_;
  std::vector<Layer> param_layers_, grad_layers_;
  float *lnf_, *lnf_mean_, *lnf_rstd_, *loss_scratch_;
  float *d_res_, *d_ln_, *d_qkv_, *d_att_, *d_fch_, *d_fca_, *d_lnf_;
  int64_t loss_chunk_;
  ContextParallel cp_;
  // Decode state.
  tensor::Arena cache_;
  int64_t cache_len_ = 0;
  std::vector<float*> kcache_, vcache_;
};

}  // namespace anvil::model
