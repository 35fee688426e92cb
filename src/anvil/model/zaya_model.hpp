// The ZAYA1 model (docs/zaya1-spec.md section 2): a tied token embedding,
// 2L layers alternating CCA attention (even) and MoE (odd), each entered
// through a residual-scaling merge and an RMSNorm, a final merge and norm,
// and the fused classifier + cross-entropy. Parameters are registered under
// the ZAYA1 checkpoint names (section 7), so weights move to and from the
// public code. Training form (forward/backward over [B, T]) with expert-bias
// balancing after each step (zaya_balancing.hpp), and token-by-token decode
// through the CCA caches (docs/zaya1.md). Its memory is planned once from
// (config, B, T, precision, experts) and carved out of one arena per kind —
// parameters, gradients, activations (backward's buffers included), the
// bf16 copies — as the Decoder's is; the plan it reports is those arenas
// (under expert parallelism plus the exchange buffers of the dispatchers,
// which follow the routing).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "anvil/model/cca_layer.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/params.hpp"
#include "anvil/model/precision.hpp"
#include "anvil/model/trainable.hpp"
#include "anvil/model/zaya_balancing.hpp"
#include "anvil/model/zaya_moe_layer.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::model {

// The registry of a ZAYA1 config (attention "cca", n_experts > 0, n_kv_heads
// 2), holding the experts of `experts` only.
ParamRegistry zaya_registry(const ModelConfig& config, ExpertRange experts = {});

class ZayaModel : public TrainableModel {
 public:
  // `experts`: the experts whose weights this process holds (all by default;
  // under expert parallelism its share, with `dispatcher` making each MoE
  // layer's expert-parallel dispatcher, which sends every other expert's
  // rows to the rank holding it; empty: every expert here).
  // `precision` bf16: the CCA projections and the experts multiply bf16
  // copies of their weights and inputs (fp32 accumulation, fp32 gradients);
  // the router, attention, norms and the classifier stay fp32.
  // With a context group of C ranks, T is the whole sequence and this rank
  // holds B x T/C tokens of it (context_parallel.hpp).
  ZayaModel(const ModelConfig& config, int64_t B, int64_t T, Balancing balancing = {},
            ExpertRange experts = {}, Precision precision = Precision::fp32,
            const MakeDispatcher& dispatcher = {}, ContextGroup* context = nullptr);
  // The layers hold pointers to the model's bf16 views: it stays where it is built.
  ZayaModel(const ZayaModel&) = delete;
  ZayaModel& operator=(const ZayaModel&) = delete;
  const ParamRegistry& registry() const override { return registry_; }
  // Mutable access marks the bf16 weight copy stale (refreshed on the next forward).
  float* params() override {
    low_stale_ = true;
    return params_f();
  }
  float* params_for_reading() override { return params_f(); }
  float* grads() override { return grads_f(); }
  bf16* fresh_bf16_weights() override { return low_stale_ ? nullptr : weights_bf16_; }
  void bf16_weights_refreshed() override { low_stale_ = false; }
  const MemoryPlan& plan() const override { return plan_; }
  ContextSeconds take_context_seconds() override {
    return {cp_.take_kv_seconds(), cp_.take_halo_seconds()};
  }
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 int64_t* scored) override;
  double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale, int64_t* scored) override;
  std::span<int64_t> step_counts() override { return step_load_; }
  void after_step(int64_t step) override;
  nlohmann::json step_metrics() const override;
  std::string progress_note() const override;
  std::vector<ExtraTensor> extra_state() override;
  // Steers expert selection only; [layers][E + 1], init 0 (skip -1, as the original).
  std::vector<std::vector<float>>& balancing_biases() { return balancer_.biases(); }
  void zero_grads() override;
  // Summed loss over rows with target >= 0; with backward, gradients of
  // (loss * grad_scale) are added to grads(), but for the experts' weights'
  // which are written over (zero_grads() leaves them alone). B and T must
  // be the planned ones.
  double forward(const int32_t* tokens, const int32_t* targets, int64_t* scored);
  double forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale,
                          int64_t* scored);
  void logits(float* out);  // after forward: [B*T, V]
  // Decode one token at a time with the CCA layers' caches (model built for
  // B = T = 1): start_decode(max_len), then decode_step(token, pos, logits [V])
  // for pos = 0, 1, 2, ... Equals the full forward's logits row by row.
  void start_decode(int64_t max_len);
  void decode_step(int32_t token, int64_t pos, float* logits);
  const ZayaMoeLayer& moe_layer(int64_t m) const { return *moe_[m]; }
  bool has_experts() const override { return true; }
  // Seconds the dispatchers spent communicating since the last call.
  double take_dispatch_seconds() override;

 private:
  CcaParams cca_params(int64_t n, float* base) const;
  ZayaMoeParams moe_params(int64_t n, float* base) const;
  float* at(const std::string& name, float* base) const;
  float* params_f() const { return reinterpret_cast<float*>(params_.base()); }
  float* grads_f() const { return reinterpret_cast<float*>(grads_.base()); }
  // Lays out every activation, layer buffer and backward buffer: one
  // function for the plan (counting) and the arena (carving).
  void carve_activations(Carver& c);
  void carve_low_precision(Carver& c);
  void run_forward(const int32_t* tokens);
  int64_t decode_pos_ = -1;  // >= 0 while decode_step runs

  void check_shape(int64_t B, int64_t T) const;

  ModelConfig c_;
  ParamRegistry registry_;
  int64_t first_expert_;
  MemoryPlan plan_;
  BiasBalancer balancer_;
  // Tokens per class of each MoE layer over the step ([layer][E + 1], flat:
  // the data-parallel trainer sums it over ranks), and of the last step.
  std::vector<int64_t> step_load_;
  std::vector<std::vector<int64_t>> last_load_;
  int64_t B_, T_, N_, H_, R_, layers_;  // T_: this rank's tokens per row
  ContextParallel cp_;
  CcaShape cca_shape_;
  ZayaMoeShape moe_shape_;
  tensor::Arena params_, grads_, acts_, low_, cache_;  // cache_: decode state
  // Parameter and gradient pointers per layer, resolved once (the arenas never move).
  std::vector<CcaParams> cca_p_, cca_g_;
  std::vector<ZayaMoeParams> moe_p_, moe_g_;
  std::vector<std::unique_ptr<CcaLayer>> cca_;
  std::vector<std::unique_ptr<ZayaMoeLayer>> moe_;
  // Backward scratch shared by the CCA layers, the MoE layers and (without
  // expert parallelism) their local dispatchers: one runs at a time.
  CcaLayer::Scratch cca_scratch_{};
  ZayaMoeLayer::Scratch moe_scratch_{};
  LocalDispatcher::Scratch local_scratch_{};
  bool local_experts_ = true;
  // Per layer: merged residual r, normed input x, its rstd, layer output h;
  // router states per MoE layer.
  std::vector<float*> r_, x_, rstd_, h_, rstate_;
  float *emb_ = nullptr, *rf_ = nullptr, *lnf_ = nullptr, *lnf_rstd_ = nullptr, *scratch_ = nullptr;
  // bf16 mode: the weights' copy and the layers' shared conversion scratch.
  bf16* weights_bf16_ = nullptr;
  kernels::Bf16Weights low_weights_;
  kernels::Bf16Scratch low_scratch_;
  bool low_stale_ = true;
  struct BackwardBuffers {
    float *d_lnf, *d_rf, *dr, *dh, *dx, *dr_prev, *dh_prev;
    std::vector<float*> drstate;  // per MoE layer
  } back_{};
};

}  // namespace anvil::model
