// The dense decoder's forward and backward passes; layer math is in kernels/.
#include "anvil/model/decoder.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <functional>

#include "anvil/base/error.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::model {
namespace {

constexpr int64_t kLossChunk = kernels::kClassifierChunk;

}  // namespace

ParamRegistry decoder_registry(const ModelConfig& c) {
  if (c.attention == Attention::cca || c.n_experts > 0) {
    throw InputError("config " + c.name +
                     ": family dense: expected attention mha or gqa and n_experts 0 (CCA and "
                     "experts are the zaya1 family's)");
  }
  ParamRegistry r;
  const float std = 0.02f;
  // GPT-2's scaled init for the projections that write into the residual.
  const float resid_std = std / std::sqrt(2.0f * static_cast<float>(c.n_layers));
  const int64_t C = c.d_model, qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  r.add("model.embed_tokens.weight", {c.vocab_size, C}, Init::normal, std, true);
  if (c.position == Position::learned) {
    r.add("model.embed_positions.weight", {c.seq_len, C}, Init::normal, std, true);
  }
  auto norm = [&](const std::string& name) {
    r.add(name + ".weight", {C}, Init::ones);
    if (c.norm == Norm::layernorm) r.add(name + ".bias", {C}, Init::zeros);
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    norm(layer_param_name(l, "input_layernorm"));
    // q, k, v weights then biases, each group contiguous: one fused GEMM.
    r.add(layer_param_name(l, "self_attn.q_proj.weight"), {qd, C}, Init::normal, std, true,
          OptimizerGroup::muon);
    r.add(layer_param_name(l, "self_attn.k_proj.weight"), {kvd, C}, Init::normal, std, true,
          OptimizerGroup::muon);
    r.add(layer_param_name(l, "self_attn.v_proj.weight"), {kvd, C}, Init::normal, std, true,
          OptimizerGroup::muon);
    if (c.bias) {
      r.add(layer_param_name(l, "self_attn.q_proj.bias"), {qd}, Init::zeros);
      r.add(layer_param_name(l, "self_attn.k_proj.bias"), {kvd}, Init::zeros);
      r.add(layer_param_name(l, "self_attn.v_proj.bias"), {kvd}, Init::zeros);
    }
    r.add(layer_param_name(l, "self_attn.o_proj.weight"), {C, qd}, Init::normal, resid_std, true,
          OptimizerGroup::muon);
    if (c.bias) r.add(layer_param_name(l, "self_attn.o_proj.bias"), {C}, Init::zeros);
    norm(layer_param_name(l, "post_attention_layernorm"));
    const int64_t F = c.ffn_hidden;
    if (c.mlp == Mlp::swiglu) {
      r.add(layer_param_name(l, "mlp.gate_proj.weight"), {F, C}, Init::normal, std, true,
            OptimizerGroup::muon);
      r.add(layer_param_name(l, "mlp.up_proj.weight"), {F, C}, Init::normal, std, true,
            OptimizerGroup::muon);
      if (c.bias) {
        r.add(layer_param_name(l, "mlp.gate_proj.bias"), {F}, Init::zeros);
        r.add(layer_param_name(l, "mlp.up_proj.bias"), {F}, Init::zeros);
      }
    } else {
      r.add(layer_param_name(l, "mlp.up_proj.weight"), {F, C}, Init::normal, std, true,
            OptimizerGroup::muon);
      if (c.bias) r.add(layer_param_name(l, "mlp.up_proj.bias"), {F}, Init::zeros);
    }
    r.add(layer_param_name(l, "mlp.down_proj.weight"), {C, F}, Init::normal, resid_std, true,
          OptimizerGroup::muon);
    if (c.bias) r.add(layer_param_name(l, "mlp.down_proj.bias"), {C}, Init::zeros);
  }
  norm("model.norm");
  if (!c.tied_embeddings) r.add("lm_head.weight", {c.vocab_size, C}, Init::normal, std, true);
  return r;
}

namespace {

// Lays the activations out through `take`, which returns null while only
// counting: one function defines both the plan and the memory.
template <typename Take>
void layout_activations(Take take, int64_t L, int64_t N, int64_t BHT, int64_t C, int64_t Q,
                        int64_t A, int64_t F, int64_t F2, int64_t V, int64_t chunk, bool training,
                        std::vector<float*>* x, std::vector<std::array<float*, 12>>* layers,
                        std::array<float*, 11>* rest) {
  for (int64_t l = 0; l <= L; ++l) x->push_back(take(N * C));
  for (int64_t l = 0; l < L; ++l) {
    // In inference only one layer's activations are alive at a time.
    const bool keep = training || l == 0;
    if (!keep) {
      layers->push_back(layers->front());
      continue;
    }
    layers->push_back({take(N * C), take(N), take(N), take(N * Q), take(N * A), take(BHT),
                       take(N * C), take(N * C), take(N), take(N), take(N * F2), take(N * F)});
  }
  (*rest)[0] = take(N * C);  // lnf
  (*rest)[1] = take(N);
  (*rest)[2] = take(N);
  (*rest)[3] = take(std::min(N, chunk) * V);  // classifier scratch
  if (training) {
    (*rest)[4] = take(N * C);  // d_res
    (*rest)[5] = take(N * C);  // d_ln
    (*rest)[6] = take(N * Q);
    (*rest)[7] = take(N * A);
    (*rest)[8] = take(N * F2);
    (*rest)[9] = take(N * F);
    (*rest)[10] = take(N * C);  // d_lnf
  }
}

}  // namespace

std::string to_string(Precision precision) {
  return precision == Precision::bf16 ? "bf16" : "fp32";
}

namespace {

// Elements in each of the two bf16 conversion buffers: the widest linear
// input or output over N rows, or a classifier chunk.
int64_t bf16_scratch_elements(const ModelConfig& c, int64_t N, int64_t chunk) {
  const int64_t Q = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
  const int64_t F2 = c.mlp == Mlp::swiglu ? 2 * c.ffn_hidden : c.ffn_hidden;
  const int64_t width = std::max({c.d_model, Q, c.n_heads * c.head_dim, F2});
  return std::max(N * width,
                  kernels::classifier_wgrad_rows(chunk, N) * std::max(c.d_model, c.vocab_size));
}

}  // namespace

MemoryPlan Decoder::plan_for(const ModelConfig& c, int64_t B, int64_t T_all, bool training,
                             Precision precision, int context) {
  const ParamRegistry r = decoder_registry(c);
  MemoryPlan p;
  p.parameters = tensor::Arena::rounded(static_cast<size_t>(r.total()) * sizeof(float));
  p.gradients = training ? p.parameters : 0;
  const int64_t T = T_all / context;  // this rank's tokens per row
  const int64_t N = B * T, Q = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
  const int64_t F2 = c.mlp == Mlp::swiglu ? 2 * c.ffn_hidden : c.ffn_hidden;
  size_t bytes = 0;
  std::vector<float*> x;
  std::vector<std::array<float*, 12>> layers;
  std::array<float*, 11> rest{};
  layout_activations(
      [&](int64_t n) -> float* {
        bytes += tensor::Arena::rounded(static_cast<size_t>(n) * sizeof(float));
        return nullptr;
      },
      c.n_layers, N, B* c.n_heads* T, c.d_model, Q, c.n_heads* c.head_dim, c.ffn_hidden, F2,
      c.vocab_size, kLossChunk, training, &x, &layers, &rest);
  p.activations =
      bytes + ContextParallel::scratch_bytes(B, T_all, context, 2 * c.n_kv_heads * c.head_dim);
  if (precision == Precision::bf16) {
    p.low_precision =
        tensor::Arena::rounded(static_cast<size_t>(r.total()) * sizeof(bf16)) +
        2 * tensor::Arena::rounded(static_cast<size_t>(bf16_scratch_elements(c, N, kLossChunk)) *
                                   sizeof(bf16));
  }
  return p;
}

Decoder::Decoder(const ModelConfig& config, int64_t B, int64_t T_all, bool training,
                 Precision precision, ContextGroup* context)
    : config_(config),
      registry_(decoder_registry(config)),
      plan_(plan_for(config, B, T_all, training, precision, context ? context->size() : 1)),
      B_(B),
      T_(T_all / (context ? context->size() : 1)),
      training_(training),
      precision_(precision),
      cp_(context, B, T_all) {
  const int64_t T = T_;
  if (T_all > config.seq_len) {
    throw InputError("sequence length " + std::to_string(T_all) +
                     " exceeds the config's seq_len " + std::to_string(config.seq_len));
  }
  C_ = config.d_model;
  Hq_ = config.n_heads;
  Hkv_ = config.n_kv_heads;
  D_ = config.head_dim;
  Q_ = (Hq_ + 2 * Hkv_) * D_;
  F_ = config.ffn_hidden;
  F2_ = config.mlp == Mlp::swiglu ? 2 * F_ : F_;
  V_ = config.vocab_size;
  L_ = config.n_layers;
  for (int64_t l = 0; l < L_; ++l) layer_begin_.push_back(registry_.layer_begin(l));
  rotary_ = config.rotary_dim == 0 ? D_ : config.rotary_dim;
  loss_chunk_ = kLossChunk;
  // Shared: data-parallel peers on the node read them in place (ZeRO-1's
  // all-gathers; comm/shm_transport.hpp).
  params_.arena = tensor::Arena("parameters", plan_.parameters, /*shared=*/true);
  if (training) grads_.arena = tensor::Arena("gradients", plan_.gradients, /*shared=*/true);
  acts_ = tensor::Arena("activations", plan_.activations);
  std::vector<std::array<float*, 12>> layers;
  std::array<float*, 11> rest{};
  layout_activations([&](int64_t n) { return acts_.take_floats(n); }, L_, B * T, B * Hq_ * T, C_,
                     Q_, Hq_ * D_, F_, F2_, V_, loss_chunk_, training, &x_, &layers, &rest);
  for (const auto& a : layers) {
    acts_by_layer_.push_back(
        {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]});
  }
  {
    Carver carver(acts_);
    cp_.carve(carver, 2 * Hkv_ * D_);
  }
  lnf_ = rest[0];
  lnf_mean_ = rest[1];
  lnf_rstd_ = rest[2];
  loss_scratch_ = rest[3];
  d_res_ = rest[4];
  d_ln_ = rest[5];
  d_qkv_ = rest[6];
  d_att_ = rest[7];
  d_fch_ = rest[8];
  d_fca_ = rest[9];
  d_lnf_ = rest[10];
  for (int64_t l = 0; l < L_; ++l) {
    param_layers_.push_back(layer(l, params_.f()));
    if (training) grad_layers_.push_back(layer(l, grads_.f()));
  }
  if (precision == Precision::bf16) {
    low_ = tensor::Arena("bf16 weights and scratch", plan_.low_precision);
    weights_bf16_ = static_cast<bf16*>(low_.take_bytes(registry_.total() * sizeof(bf16)));
    scratch_.capacity = bf16_scratch_elements(config, B * T, loss_chunk_);
    scratch_.a = static_cast<bf16*>(low_.take_bytes(scratch_.capacity * sizeof(bf16)));
    scratch_.b = static_cast<bf16*>(low_.take_bytes(scratch_.capacity * sizeof(bf16)));
  }
}

kernels::MatmulWeight Decoder::matmul_weight(const float* w) const {
  if (weights_bf16_ == nullptr) return {w};
  return {w, weights_bf16_ + (w - params_.f())};
}

void Decoder::refresh_low_precision() {
  if (weights_bf16_ == nullptr || !low_stale_) return;
  kernels::convert_to_bf16(weights_bf16_, params_.f(), registry_.total());
  low_stale_ = false;
}

const float* Decoder::param(const std::string& name, const float* base) const {
  const ParamSpec* s = registry_.find(name);
  return s == nullptr ? nullptr : base + s->offset;
}

Decoder::Layer Decoder::layer(int64_t l, const float* base) const {
  Layer p{};
  p.ln1_w = param(layer_param_name(l, "input_layernorm.weight"), base);
  p.ln1_b = param(layer_param_name(l, "input_layernorm.bias"), base);
  p.qkv_w = param(layer_param_name(l, "self_attn.q_proj.weight"), base);
  p.qkv_b = param(layer_param_name(l, "self_attn.q_proj.bias"), base);
  p.o_w = param(layer_param_name(l, "self_attn.o_proj.weight"), base);
  p.o_b = param(layer_param_name(l, "self_attn.o_proj.bias"), base);
  p.ln2_w = param(layer_param_name(l, "post_attention_layernorm.weight"), base);
  p.ln2_b = param(layer_param_name(l, "post_attention_layernorm.bias"), base);
  const bool swiglu = config_.mlp == Mlp::swiglu;
  p.up_w = param(layer_param_name(l, swiglu ? "mlp.gate_proj.weight" : "mlp.up_proj.weight"), base);
  p.up_b = param(layer_param_name(l, swiglu ? "mlp.gate_proj.bias" : "mlp.up_proj.bias"), base);
  p.down_w = param(layer_param_name(l, "mlp.down_proj.weight"), base);
  p.down_b = param(layer_param_name(l, "mlp.down_proj.bias"), base);
  return p;
}

const float* Decoder::classifier_weight(const float* base) const {
  return param(config_.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", base);
}

void Decoder::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                           const float* b, int64_t N) const {
  const auto eps = static_cast<float>(config_.norm_eps);
  if (config_.norm == Norm::layernorm) {
    kernels::layernorm_forward(out, mean, rstd, inp, w, b, N, C_, eps);
  } else {
    kernels::rmsnorm_forward(out, rstd, inp, w, N, C_, eps);
  }
}

void Decoder::norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                            const float* w, const float* mean, const float* rstd, int64_t N) const {
  if (config_.norm == Norm::layernorm) {
    kernels::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C_);
  } else {
    kernels::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C_);
  }
}

void Decoder::zero_grads() {
  kernels::zero_bytes(grads_.f(), static_cast<int64_t>(grads_.arena.capacity()));
}

void check_forward_batch(const int32_t* tokens, int64_t B, int64_t T, int64_t planned_B,
                         int64_t planned_T, int64_t V) {
  if (B > planned_B || T > planned_T || B < 1 || T < 1) {
    throw InputError("forward: batch " + std::to_string(B) + "x" + std::to_string(T) +
                     " exceeds the planned " + std::to_string(planned_B) + "x" +
                     std::to_string(planned_T));
  }
  for (int64_t i = 0; i < B * T; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw InputError("token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
  }
}

void Decoder::run_forward(const int32_t* tokens, int64_t B, int64_t T) {
  check_forward_batch(tokens, B, T, B_, T_, V_);
  if (cp_.split() && (B != B_ || T != T_)) {
    throw InputError("forward: context parallelism needs the planned batch " +
                     std::to_string(B_) + "x" + std::to_string(T_) + " (this rank's chunks)");
  }
  const int64_t N = B * T;
  refresh_low_precision();
  const float* P = params_.f();
  const float* wpe = param("model.embed_positions.weight", P);
  if (cp_.split()) {  // each chunk at its global positions
    cp_.for_each_chunk([&](int64_t row, int64_t S, int64_t pos) {
      kernels::embedding_forward(x_[0] + row * C_, tokens + row,
                                 param("model.embed_tokens.weight", P),
                                 wpe == nullptr ? nullptr : wpe + pos * C_, 1, S, C_);
    });
  } else {
    kernels::embedding_forward(x_[0], tokens, param("model.embed_tokens.weight", P), wpe, B, T,
                               C_);
  }
  for (int64_t l = 0; l < L_; ++l) {
    const Layer& p = layer_params(l);
    const LayerActs& a = acts_by_layer_[l];
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_[l], p.ln1_w, p.ln1_b, N);
    kernels::linear_forward(a.qkv, a.ln1, matmul_weight(p.qkv_w), p.qkv_b, N, C_, Q_, &scratch_);
    if (config_.position == Position::rope) rope(a.qkv, N, T, false);
    if (cp_.split())
      cp_.attention_forward(a.att, a.lse, a.qkv, Hq_, Hkv_, D_, attention_tiles());
    else
      kernels::attention_forward(a.att, a.lse, a.qkv, B, T, Hq_, Hkv_, D_, attention_tiles());
    kernels::linear_forward(a.mid, a.att, matmul_weight(p.o_w), p.o_b, N, Hq_ * D_, C_, &scratch_);
    kernels::residual_forward(a.mid, a.mid, x_[l], N * C_);
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, p.ln2_w, p.ln2_b, N);
    kernels::linear_forward(a.fch, a.ln2, matmul_weight(p.up_w), p.up_b, N, C_, F2_, &scratch_);
    if (config_.mlp == Mlp::swiglu) {
      kernels::swiglu_forward(a.fca, a.fch, N, F_);
    } else {
      kernels::gelu_forward(a.fca, a.fch, N * F_);
    }
    kernels::linear_forward(x_[l + 1], a.fca, matmul_weight(p.down_w), p.down_b, N, F_, C_,
                            &scratch_);
    kernels::residual_forward(x_[l + 1], x_[l + 1], a.mid, N * C_);
  }
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x_[L_], param("model.norm.weight", P),
               param("model.norm.bias", P), N);
}

double Decoder::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        int64_t* scored) {
  run_forward(tokens, B, T);
  return kernels::classifier_loss(nullptr, nullptr, lnf_,
                                  matmul_weight(classifier_weight(params_.f())), targets, B * T, C_,
                                  V_, loss_scratch_, loss_chunk_, scored, 0.0f, &scratch_);
}

double Decoder::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                 int64_t T, float grad_scale, int64_t* scored) {
  if (!training_) throw InputError("forward_backward on a decoder built for inference");
  run_forward(tokens, B, T);
  const int64_t N = B * T;
  std::memset(d_lnf_, 0, static_cast<size_t>(N * C_) * sizeof(float));
  const double loss =
      kernels::classifier_loss(d_lnf_, const_cast<float*>(classifier_weight(grads_.f())), lnf_,
                               matmul_weight(classifier_weight(params_.f())), targets, N, C_, V_,
                               loss_scratch_, loss_chunk_, scored, grad_scale, &scratch_);
  run_backward(tokens, B, T);
  return loss;
}

void Decoder::run_backward(const int32_t* tokens, int64_t B, int64_t T) {
  const int64_t N = B * T;
  const float* P = params_.f();
  float* G = grads_.f();
  auto mut = [](const float* p) { return const_cast<float*>(p); };
  kernels::zero(d_res_, N * C_);
  norm_backward(d_res_, mut(param("model.norm.weight", G)), mut(param("model.norm.bias", G)),
                d_lnf_, x_[L_], param("model.norm.weight", P), lnf_mean_, lnf_rstd_, N);
  for (int64_t l = L_ - 1; l >= 0; --l) {
    const Layer& p = layer_params(l);
    const Layer& g = layer_grads(l);
    const LayerActs& a = acts_by_layer_[l];
    // x[l+1] = mid + down(act(up(norm2(mid)))). The input gradients of the
    // projections and activations are fresh buffers: written, not cleared
    // and added to; the weights' gradients add (micro-batches).
    constexpr auto kFresh = kernels::GradStore::write_input;
    constexpr auto kAuto = device::GemmBackend::automatic;
    kernels::linear_backward(d_fca_, mut(g.down_w), mut(g.down_b), d_res_, a.fca,
                             matmul_weight(p.down_w), N, F_, C_, &scratch_, kAuto, kFresh);
    if (config_.mlp == Mlp::swiglu) {
      kernels::swiglu_backward(d_fch_, d_fca_, a.fch, N, F_, kFresh);
    } else {
      kernels::gelu_backward(d_fch_, a.fch, d_fca_, N * F_, kFresh);
    }
    kernels::linear_backward(d_ln_, mut(g.up_w), mut(g.up_b), d_fch_, a.ln2, matmul_weight(p.up_w),
                             N, C_, F2_, &scratch_, kAuto, kFresh);
    norm_backward(d_res_, mut(g.ln2_w), mut(g.ln2_b), d_ln_, a.mid, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                  N);
    // mid = x[l] + o(attention(rope(qkv(norm1(x[l])))))
    kernels::linear_backward(d_att_, mut(g.o_w), mut(g.o_b), d_res_, a.att, matmul_weight(p.o_w), N,
                             Hq_ * D_, C_, &scratch_, kAuto, kFresh);
    if (cp_.split())
      cp_.attention_backward(d_qkv_, d_att_, a.qkv, a.att, a.lse, Hq_, Hkv_, D_, attention_tiles());
    else
      kernels::attention_backward(d_qkv_, d_att_, a.qkv, a.att, a.lse, B, T, Hq_, Hkv_, D_,
                                  attention_tiles());
    if (config_.position == Position::rope) rope(d_qkv_, N, T, true);
    kernels::linear_backward(d_ln_, mut(g.qkv_w), mut(g.qkv_b), d_qkv_, a.ln1,
                             matmul_weight(p.qkv_w), N, C_, Q_, &scratch_, kAuto, kFresh);
    norm_backward(d_res_, mut(g.ln1_w), mut(g.ln1_b), d_ln_, x_[l], p.ln1_w, a.ln1_mean, a.ln1_rstd,
                  N);
    grads_ready_from(layer_begin_[static_cast<size_t>(l)]);
  }
  float* dwpe = mut(param("model.embed_positions.weight", G));
  if (cp_.split()) {
    cp_.for_each_chunk([&](int64_t row, int64_t S, int64_t pos) {
      kernels::embedding_backward(mut(param("model.embed_tokens.weight", G)),
                                  dwpe == nullptr ? nullptr : dwpe + pos * C_, d_res_ + row * C_,
                                  tokens + row, 1, S, C_);
    });
  } else {
    kernels::embedding_backward(mut(param("model.embed_tokens.weight", G)), dwpe, d_res_, tokens,
                                B, T, C_);
  }
  grads_ready_from(0);
}

void Decoder::rope(float* x, int64_t N, int64_t T, bool backward) const {
  const auto theta = static_cast<float>(config_.rope_theta);
  auto apply = [&](float* rows, int64_t n, int64_t t, int64_t pos0) {
    auto f = backward ? kernels::rope_backward : kernels::rope_forward;
    f(rows, n, t, pos0, Hq_, D_, rotary_, Q_, theta);
    f(rows + Hq_ * D_, n, t, pos0, Hkv_, D_, rotary_, Q_, theta);
  };
  if (!cp_.split()) {
    apply(x, N, T, 0);
    return;
  }
  cp_.for_each_chunk([&](int64_t row, int64_t S, int64_t pos) { apply(x + row * Q_, S, S, pos); });
}

void Decoder::logits(float* out, int64_t B, int64_t T) {
  device::gemm(false, true, B * T, V_, C_, 1.0f, lnf_, C_, classifier_weight(params_.f()), C_, 0.0f,
               out, V_);
}

void Decoder::start_decode(int64_t max_len) {
  if (max_len > config_.seq_len) {
    throw InputError("decode length " + std::to_string(max_len) + " exceeds the config's seq_len " +
                     std::to_string(config_.seq_len));
  }
  const int64_t kv = Hkv_ * D_;
  cache_ = tensor::Arena("kv cache", 2 * L_ * tensor::Arena::rounded(max_len * kv * sizeof(float)));
  kcache_.clear();
  vcache_.clear();
  for (int64_t l = 0; l < L_; ++l) {
    kcache_.push_back(cache_.take_floats(max_len * kv));
    vcache_.push_back(cache_.take_floats(max_len * kv));
  }
  cache_len_ = max_len;
}

void Decoder::decode_step(int32_t token, int64_t pos, float* logits) {
  if (pos >= cache_len_) {
    throw InputError("decode position " + std::to_string(pos) + " is past the KV cache (" +
                     std::to_string(cache_len_) + " positions)");
  }
  if (token < 0 || token >= V_) {
    throw InputError("token " + std::to_string(token) + " is outside the vocabulary [0, " +
                     std::to_string(V_) + ")");
  }
  const float* P = params_.f();
  float* x = x_[0];
  const float* wpe = param("model.embed_positions.weight", P);
  kernels::embedding_forward(x, &token, param("model.embed_tokens.weight", P),
                             wpe == nullptr ? nullptr : wpe + pos * C_, 1, 1, C_);
  const auto theta = static_cast<float>(config_.rope_theta);
  const LayerActs& a = acts_by_layer_[0];
  const int64_t kv = Hkv_ * D_;
  for (int64_t l = 0; l < L_; ++l) {
    const Layer& p = layer_params(l);
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, 1);
    kernels::linear_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, 1, C_, Q_);
    if (config_.position == Position::rope) {
      kernels::rope_forward(a.qkv, 1, 1, pos, Hq_, D_, rotary_, Q_, theta);
      kernels::rope_forward(a.qkv + Hq_ * D_, 1, 1, pos, Hkv_, D_, rotary_, Q_, theta);
    }
    std::memcpy(kcache_[l] + pos * kv, a.qkv + Hq_ * D_, kv * sizeof(float));
    std::memcpy(vcache_[l] + pos * kv, a.qkv + Hq_ * D_ + kv, kv * sizeof(float));
    kernels::attention_decode(a.att, a.qkv, kcache_[l], vcache_[l], pos + 1, Hq_, Hkv_, D_);
    kernels::linear_forward(a.mid, a.att, p.o_w, p.o_b, 1, Hq_ * D_, C_);
    kernels::residual_forward(a.mid, a.mid, x, C_);
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, p.ln2_w, p.ln2_b, 1);
    kernels::linear_forward(a.fch, a.ln2, p.up_w, p.up_b, 1, C_, F2_);
    if (config_.mlp == Mlp::swiglu) {
      kernels::swiglu_forward(a.fca, a.fch, 1, F_);
    } else {
      kernels::gelu_forward(a.fca, a.fch, F_);
    }
    kernels::linear_forward(x, a.fca, p.down_w, p.down_b, 1, F_, C_);
    kernels::residual_forward(x, x, a.mid, C_);
  }
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x, param("model.norm.weight", P),
               param("model.norm.bias", P), 1);
  device::gemm(false, true, 1, V_, C_, 1.0f, lnf_, C_, classifier_weight(P), C_, 0.0f, logits, V_);
}

}  // namespace anvil::model
