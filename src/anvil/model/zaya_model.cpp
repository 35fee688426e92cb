// The ZAYA1 model: its registry, its memory laid out over the arenas, the
// forward and backward passes over the alternating CCA and MoE layers,
// decode, and the router statistics and balancing the trainer reads after
// each step. The layers' math is in cca_layer and zaya_moe_layer.
#include "anvil/model/zaya_model.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "anvil/base/error.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/kernels/zaya.hpp"

namespace anvil::model {
namespace {

constexpr int64_t kLossChunk = kernels::kClassifierChunk;

}  // namespace

ParamRegistry zaya_registry(const ModelConfig& c, ExpertRange experts) {
  if (c.attention != Attention::cca || c.n_experts < 1 || c.n_kv_heads != 2 || c.router_dim < 1 ||
      c.expert_ffn_hidden < 1 || !c.tied_embeddings) {
    throw InputError("config " + c.name +
                     ": ZAYA1 needs attention cca, n_kv_heads 2, n_experts >= 1, router_dim >= 1, "
                     "expert_ffn_hidden >= 1 and tied embeddings");
  }
  const int64_t H = c.d_model, d = c.head_dim, Cq = c.n_heads * d, Ck = 2 * d, C = Cq + Ck;
  const int64_t R = c.router_dim, E = c.n_experts, F = c.expert_ffn_hidden;
  const int64_t e0 = experts.first, e1 = experts.count < 0 ? E : e0 + experts.count;
  if (e0 < 0 || e1 > E || e1 <= e0) {
    throw InputError("config " + c.name + ": experts [" + std::to_string(e0) + ", " +
                     std::to_string(e1) + ") are not a range of its " + std::to_string(E));
  }
  const float std = 0.02f;
  const auto rstd = static_cast<float>(c.router_init_std);
  const auto muon = OptimizerGroup::muon;
  ParamRegistry r;
  r.add("model.embed_tokens.weight", {c.vocab_size, H}, Init::normal, std, true);
  auto res_scale = [&](const std::string& prefix, bool with_residual) {
    r.add(prefix + "res_scale.hidden_states_scale", {H}, Init::ones);
    r.add(prefix + "res_scale.hidden_states_bias", {H}, Init::zeros);
    if (with_residual) {
      r.add(prefix + "res_scale.residual_scale", {H}, Init::ones);
      r.add(prefix + "res_scale.residual_bias", {H}, Init::zeros);
    }
  };
  for (int64_t n = 0; n < 2 * c.n_layers; ++n) {
    r.add(layer_param_name(n, "input_norm.weight"), {H}, Init::ones);
    res_scale(layer_param_name(n, ""), n > 0);
    if (n % 2 == 0) {
      const std::string a = layer_param_name(n, "self_attn.");
      r.add(a + "qkv.linear_q.weight", {Cq, H}, Init::normal, std, true, muon);
      r.add(a + "qkv.linear_k.weight", {Ck, H}, Init::normal, std, true,
            muon);  // after q: one GEMM
      r.add(a + "qkv.val_proj1.weight", {d, H}, Init::normal, std, true, muon);
      r.add(a + "qkv.val_proj2.weight", {d, H}, Init::normal, std, true, muon);
      r.add(a + "qkv.conv_qk.0.weight", {C, 1, 2}, Init::normal, std, true);
      r.add(a + "qkv.conv_qk.0.bias", {C}, Init::zeros);
      r.add(a + "qkv.conv_qk.1.weight", {C, d, 2}, Init::normal, std, true);
      r.add(a + "qkv.conv_qk.1.bias", {C}, Init::zeros);
      r.add(a + "qkv.temp", {2}, Init::constant, static_cast<float>(c.key_temp_init));
      r.add(a + "o_proj.weight", {H, Cq}, Init::normal, std, true, muon);
    } else {
      const std::string a = layer_param_name(n, "zaya_block.router.");
      r.add(a + "down_proj.weight", {R, H}, Init::normal, std, true, muon);
      r.add(a + "down_proj.bias", {R}, Init::zeros);
      if (n > 1) r.add(a + "router_states_scale", {R}, Init::ones);
      r.add(a + "rmsnorm_eda.weight", {R}, Init::ones);
      r.add(a + "router_mlp.0.weight", {R, R}, Init::normal, rstd, true, muon);
      r.add(a + "router_mlp.0.bias", {R}, Init::zeros);
      r.add(a + "router_mlp.2.weight", {R, R}, Init::normal, rstd, true, muon);
      r.add(a + "router_mlp.2.bias", {R}, Init::zeros);
      r.add(a + "router_mlp.4.weight", {E + 1, R}, Init::normal, rstd, true, muon);
      r.scale_lr(a, static_cast<float>(c.router_lr_scale));
      const std::string ex = layer_param_name(n, "zaya_block.experts.local_experts.");
      // All fc1 then all fc2: each a contiguous [E, ...] block for the layer
      // (under expert parallelism, of this rank's experts e0..e1 only).
      for (int64_t e = e0; e < e1; ++e) {
        r.add(ex + std::to_string(e) + ".linear_fc1.weight", {2 * F, H}, Init::normal, std, true,
              muon);
      }
      for (int64_t e = e0; e < e1; ++e) {
        r.add(ex + std::to_string(e) + ".linear_fc2.weight", {H, F}, Init::normal, std, true, muon);
      }
    }
  }
  r.add("model.final_norm.weight", {H}, Init::ones);
  res_scale("model.", true);
  r.set_sharding(".zaya_block.experts.", Sharding::expert);
  return r;
}

namespace {

CcaShape cca_shape(const ModelConfig& c) {
  CcaShape s;
  s.hidden = c.d_model;
  s.q_heads = c.n_heads;
  s.kv_heads = 2;
  s.head_dim = c.head_dim;
  s.rotary_dim = c.rotary_dim == 0 ? c.head_dim : c.rotary_dim;
  s.rope_theta = static_cast<float>(c.rope_theta);
  return s;
}

ZayaMoeShape moe_shape(const ModelConfig& c) {
  ZayaMoeShape s;
  s.hidden = c.d_model;
  s.router_dim = c.router_dim;
  s.experts = c.n_experts;
  s.expert_ffn = c.expert_ffn_hidden;
  s.top_k = c.top_k;
  s.norm_eps = static_cast<float>(c.norm_eps);
  s.skip_identity = c.skip_output == SkipOutput::input;
  return s;
}

}  // namespace

ZayaModel::ZayaModel(const ModelConfig& config, int64_t B, int64_t T_all, Balancing balancing,
                     ExpertRange experts, Precision precision, const MakeDispatcher& dispatcher,
                     ContextGroup* context)
    : c_(config),
      registry_(zaya_registry(config, experts)),
      first_expert_(experts.first),
      balancer_(std::move(balancing), config.n_layers, config.n_experts),
      B_(B),
      T_(T_all / (context ? context->size() : 1)),
      N_(B * T_),
      H_(config.d_model),
      R_(config.router_dim),
      layers_(2 * config.n_layers),
      cp_(context, B, T_all),
      cca_shape_(cca_shape(config)),
      moe_shape_(moe_shape(config)),
      local_experts_(!dispatcher) {
  if (T_all > config.seq_len) throw InputError("sequence length exceeds the config's seq_len");
  const int64_t T = T_;
  const RouterLossCoefs losses{balancer_.settings().aux_loss_coef,
                               balancer_.settings().z_loss_coef};
  for (int64_t n = 0; n < layers_; ++n) {
    if (n % 2 == 0) {
      cca_.push_back(std::make_unique<CcaLayer>(cca_shape_, B, T, &cp_));
    } else {
      moe_.push_back(std::make_unique<ZayaMoeLayer>(
          moe_shape_, N_, losses,
          dispatcher ? dispatcher(moe_shape_, N_)
                     : std::make_unique<LocalDispatcher>(moe_shape_, N_, &local_scratch_)));
    }
  }
  for (auto* v : {&r_, &x_, &rstd_, &h_}) v->resize(static_cast<size_t>(layers_));
  rstate_.resize(moe_.size());
  back_.drstate.resize(moe_.size());
  const size_t param_bytes = static_cast<size_t>(registry_.total()) * sizeof(float);
  // Shared: data-parallel peers on the node read them in place (ZeRO-1's
  // all-gathers; comm/shm_transport.hpp).
  params_ = tensor::Arena("parameters", param_bytes, /*shared=*/true);
  grads_ = tensor::Arena("gradients", param_bytes, /*shared=*/true);
  acts_ = carve_arena("activations", [&](Carver& c) { carve_activations(c); });
  // The tensors' bytes (the arena adds under 64 bytes of alignment): what
  // the trainer reports as parameter bytes and compares across --ep layouts.
  plan_.parameters = param_bytes;
  plan_.gradients = param_bytes;
  plan_.activations = acts_.capacity();
  for (const auto& l : moe_) plan_.activations += l->dispatcher().heap_bytes();
  for (int64_t n = 0; n < layers_; ++n) {
    if (n % 2 == 0) {
      cca_p_.push_back(cca_params(n, params_f()));
      cca_g_.push_back(cca_params(n, grads_f()));
    } else {
      moe_p_.push_back(moe_params(n, params_f()));
      moe_g_.push_back(moe_params(n, grads_f()));
    }
  }
  const size_t K = static_cast<size_t>(c_.n_experts + 1);
  step_load_.assign(moe_.size() * K, 0);
  last_load_.assign(moe_.size(), std::vector<int64_t>(K, 0));
  if (precision == Precision::bf16) {
    low_ = carve_arena("bf16 weights and scratch", [&](Carver& c) { carve_low_precision(c); });
    plan_.low_precision = low_.capacity();
    low_weights_ = {params_f(), weights_bf16_};
    for (auto& l : cca_) l->set_bf16(&low_weights_, &low_scratch_);
    for (auto& l : moe_) l->set_bf16(&low_weights_, &low_scratch_);
  }
}

void ZayaModel::carve_activations(Carver& c) {
  const int64_t NH = N_ * H_;
  // The shared backward scratch first: the layers copy its pointers.
  cca_scratch_.carve(c, cca_shape_, N_);
  moe_scratch_.carve(c, moe_shape_, N_);
  cp_.carve(c, 2 * cca_shape_.kv_heads * cca_shape_.head_dim);
  if (local_experts_) local_scratch_.carve(c, moe_shape_, N_);
  for (int64_t n = 0; n < layers_; ++n) {
    r_[n] = c.take<float>(NH);
    x_[n] = c.take<float>(NH);
    rstd_[n] = c.take<float>(N_);
    h_[n] = c.take<float>(NH);
    if (n % 2 == 0) {
      cca_[n / 2]->carve(c, cca_scratch_);
    } else {
      rstate_[n / 2] = c.take<float>(N_ * R_);
      moe_[n / 2]->carve(c, moe_scratch_);
    }
  }
  emb_ = c.take<float>(NH);
  rf_ = c.take<float>(NH);
  lnf_ = c.take<float>(NH);
  lnf_rstd_ = c.take<float>(N_);
  scratch_ = c.take<float>(std::min(N_, kLossChunk) * c_.vocab_size);
  for (float** v : {&back_.d_lnf, &back_.d_rf, &back_.dr, &back_.dh, &back_.dx, &back_.dr_prev,
                    &back_.dh_prev}) {
    *v = c.take<float>(NH);
  }
  for (auto& d : back_.drstate) d = c.take<float>(N_ * R_);
}

void ZayaModel::carve_low_precision(Carver& c) {
  // One conversion scratch for every layer (they run one at a time).
  const int64_t capacity = std::max(CcaLayer::bf16_scratch(cca_shape_, N_),
                                    experts_bf16_scratch(moe_shape_, N_ * c_.top_k));
  weights_bf16_ = c.take<bf16>(registry_.total());
  low_scratch_ = {c.take<bf16>(capacity), c.take<bf16>(capacity), capacity};
}

void ZayaModel::check_shape(int64_t B, int64_t T) const {
  if (B != B_ || T != T_) {
    throw InputError("ZAYA1 model: batch " + std::to_string(B) + "x" + std::to_string(T) +
                     " is not the planned " + std::to_string(B_) + "x" + std::to_string(T_));
  }
}

double ZayaModel::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          int64_t* scored) {
  check_shape(B, T);
  return forward(tokens, targets, scored);
}

double ZayaModel::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                   int64_t T, float grad_scale, int64_t* scored) {
  check_shape(B, T);
  const double loss = forward_backward(tokens, targets, grad_scale, scored);
  for (size_t m = 0; m < moe_.size(); ++m) {
    const auto& load = moe_[m]->stats().tokens_per_class;
    for (size_t e = 0; e < load.size(); ++e) step_load_[m * load.size() + e] += load[e];
  }
  return loss;
}

double ZayaModel::take_dispatch_seconds() {
  double s = 0;
  for (auto& layer : moe_) s += layer->dispatcher().take_comm_seconds();
  return s;
}

void ZayaModel::after_step(int64_t step) {
  const size_t K = static_cast<size_t>(c_.n_experts + 1);
  for (size_t m = 0; m < moe_.size(); ++m) {
    const auto first = step_load_.begin() + static_cast<std::ptrdiff_t>(m * K);
    last_load_[m].assign(first, first + static_cast<std::ptrdiff_t>(K));
    balancer_.update(static_cast<int64_t>(m), last_load_[m], step);
  }
  std::fill(step_load_.begin(), step_load_.end(), 0);
}

nlohmann::json ZayaModel::step_metrics() const {
  nlohmann::json layers = nlohmann::json::array();
  const int64_t E = c_.n_experts;
  for (size_t m = 0; m < last_load_.size(); ++m) {
    const auto& load = last_load_[m];
    int64_t total = 0, routed = 0, lo = INT64_MAX, hi = 0;
    for (int64_t e = 0; e <= E; ++e) total += load[e];
    double entropy = 0;
    for (int64_t e = 0; e < E; ++e) {
      routed += load[e];
      lo = std::min(lo, load[e]);
      hi = std::max(hi, load[e]);
    }
    for (int64_t e = 0; e < E && routed > 0; ++e) {
      const double p = static_cast<double>(load[e]) / routed;
      if (p > 0) entropy -= p * std::log(p);
    }
    layers.push_back({{"layer", 2 * m + 1},
                      {"load", load},
                      {"max_over_min",  // null: an expert got no token (no ratio)
                       lo > 0 ? nlohmann::json(static_cast<double>(hi) / lo) : nlohmann::json()},
                      {"skip_rate", total > 0 ? static_cast<double>(load[E]) / total : 0.0},
                      {"aux_loss", moe_[m]->stats().aux_loss},
                      {"z_loss", moe_[m]->stats().z_loss},
                      {"entropy", entropy},
                      {"margin", moe_[m]->stats().margin},
                      {"bias", balancer_.biases()[m]}});
  }
  return {{"router", layers}};
}

std::string ZayaModel::progress_note() const {
  // The worst layer's max/min expert load and the mean skip rate.
  double worst = 1, skip = 0;
  bool empty = false;
  const auto metrics = step_metrics()["router"];
  for (const auto& l : metrics) {
    if (l["max_over_min"].is_null()) {
      empty = true;
    } else {
      worst = std::max(worst, l["max_over_min"].get<double>());
    }
    skip += l["skip_rate"].get<double>();
  }
  char buf[96];
  char ratio[16];
  std::snprintf(ratio, sizeof ratio, "%.3g", worst);
  std::snprintf(buf, sizeof buf, "load max/min %s | skip %.1f%%", empty ? "inf" : ratio,
                metrics.empty() ? 0.0 : 100 * skip / static_cast<double>(metrics.size()));
  return buf;
}

std::vector<ExtraTensor> ZayaModel::extra_state() {
  std::vector<ExtraTensor> out;
  const int64_t K = c_.n_experts + 1;
  for (size_t m = 0; m < moe_.size(); ++m) {
    const std::string name =
        layer_param_name(2 * static_cast<int64_t>(m) + 1, "zaya_block.router.balancing_biases");
    out.push_back({name, {K}, balancer_.biases()[m].data(), false});
    out.push_back({name + ".exp_avg", {K}, balancer_.first_moments()[m].data(), true});
    out.push_back({name + ".exp_avg_sq", {K}, balancer_.second_moments()[m].data(), true});
  }
  return out;
}

float* ZayaModel::at(const std::string& name, float* base) const {
  const ParamSpec* s = registry_.find(name);
  return s == nullptr ? nullptr : base + s->offset;
}

CcaParams ZayaModel::cca_params(int64_t n, float* base) const {
  const std::string a = layer_param_name(n, "self_attn.");
  return {at(a + "qkv.linear_q.weight", base),  at(a + "qkv.val_proj1.weight", base),
          at(a + "qkv.val_proj2.weight", base), at(a + "qkv.conv_qk.0.weight", base),
          at(a + "qkv.conv_qk.0.bias", base),   at(a + "qkv.conv_qk.1.weight", base),
          at(a + "qkv.conv_qk.1.bias", base),   at(a + "qkv.temp", base),
          at(a + "o_proj.weight", base)};
}

ZayaMoeParams ZayaModel::moe_params(int64_t n, float* base) const {
  const std::string a = layer_param_name(n, "zaya_block.router.");
  const std::string ex = layer_param_name(
      n, "zaya_block.experts.local_experts." + std::to_string(first_expert_) + ".");
  return {{at(a + "down_proj.weight", base), at(a + "down_proj.bias", base),
           at(a + "router_states_scale", base), at(a + "rmsnorm_eda.weight", base),
           at(a + "router_mlp.0.weight", base), at(a + "router_mlp.0.bias", base),
           at(a + "router_mlp.2.weight", base), at(a + "router_mlp.2.bias", base),
           at(a + "router_mlp.4.weight", base)},
          {at(ex + "linear_fc1.weight", base), at(ex + "linear_fc2.weight", base)}};
}

void ZayaModel::zero_grads() {
  // The experts' weights (most of the parameters) are left out: their
  // backward writes their gradients whole (zaya_experts.hpp).
  float* g = grads_f();
  int64_t from = 0;
  for (const ParamSpec& s : registry_.specs()) {
    if (s.sharding != Sharding::expert) continue;
    kernels::zero(g + from, s.offset - from);
    from = s.offset + s.numel;
  }
  kernels::zero(g + from, registry_.total() - from);
}

void ZayaModel::run_forward(const int32_t* tokens) {
  for (int64_t i = 0; i < N_; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c_.vocab_size)
      throw InputError("token outside the vocabulary");
  }
  if (weights_bf16_ != nullptr && low_stale_) {
    kernels::convert_to_bf16(weights_bf16_, params_f(), registry_.total());
    low_stale_ = false;
  }
  float* P = params_f();
  const auto eps = static_cast<float>(c_.norm_eps);
  kernels::embedding_forward(emb_, tokens, at("model.embed_tokens.weight", P), nullptr, B_, T_, H_);
  const float* h = emb_;
  const float* r = nullptr;
  for (int64_t n = 0; n < layers_; ++n) {
    const std::string p = layer_param_name(n, "res_scale.");
    kernels::residual_merge_forward(r_[n], r, h, at(p + "hidden_states_scale", P),
                                    at(p + "hidden_states_bias", P), at(p + "residual_scale", P),
                                    at(p + "residual_bias", P), N_, H_);
    kernels::rmsnorm_forward(x_[n], rstd_[n], r_[n],
                             at(layer_param_name(n, "input_norm.weight"), P), N_, H_, eps);
    if (n % 2 == 0 && decode_pos_ >= 0) {
      cca_[n / 2]->decode_step(h_[n], x_[n], cca_p_[n / 2], decode_pos_);
    } else if (n % 2 == 0) {
      cca_[n / 2]->forward(h_[n], x_[n], cca_p_[n / 2]);
    } else {
      const int64_t m = n / 2;
      moe_[m]->forward(h_[n], rstate_[m], x_[n], m > 0 ? rstate_[m - 1] : nullptr, moe_p_[m],
                       balancer_.biases(static_cast<int64_t>(m)));
    }
    h = h_[n];
    r = r_[n];
  }
  kernels::residual_merge_forward(rf_, r, h, at("model.res_scale.hidden_states_scale", P),
                                  at("model.res_scale.hidden_states_bias", P),
                                  at("model.res_scale.residual_scale", P),
                                  at("model.res_scale.residual_bias", P), N_, H_);
  kernels::rmsnorm_forward(lnf_, lnf_rstd_, rf_, at("model.final_norm.weight", P), N_, H_, eps);
}

void ZayaModel::start_decode(int64_t max_len) {
  if (N_ != 1) throw InputError("ZAYA1 decode: the model must be built for B = 1, T = 1");
  if (max_len < 1 || max_len > c_.seq_len)
    throw InputError("ZAYA1 decode: max_len must be in 1.." + std::to_string(c_.seq_len));
  cache_ = carve_arena("decode cache", [&](Carver& c) {
    for (auto& layer : cca_) layer->start_decode(max_len, c);
  });
}

void ZayaModel::decode_step(int32_t token, int64_t pos, float* out) {
  decode_pos_ = pos;
  try {
    run_forward(&token);
  } catch (...) {
    decode_pos_ = -1;
    throw;
  }
  decode_pos_ = -1;
  logits(out);
}

double ZayaModel::forward(const int32_t* tokens, const int32_t* targets, int64_t* scored) {
  run_forward(tokens);
  return kernels::classifier_loss(nullptr, nullptr, lnf_,
                                  at("model.embed_tokens.weight", params_f()), targets, N_, H_,
                                  c_.vocab_size, scratch_, kLossChunk, scored, 0.0f);
}

void ZayaModel::logits(float* out) {
  device::gemm(false, true, N_, c_.vocab_size, H_, 1.0f, lnf_, H_,
               at("model.embed_tokens.weight", params_f()), H_, 0.0f, out, c_.vocab_size);
}

double ZayaModel::forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale,
                                   int64_t* scored) {
  run_forward(tokens);
  float* P = params_f();
  float* G = grads_f();
  const int64_t NH = N_ * H_;
  // Backward's buffers are carved with the activations: no allocation (and
  // no page faults) per step; the accumulating ones are cleared here.
  const auto zeroed = [](float* v, int64_t n) {
    kernels::zero(v, n);
    return v;
  };
  float* d_lnf = zeroed(back_.d_lnf, NH);
  float* d_rf = zeroed(back_.d_rf, NH);
  const double loss = kernels::classifier_loss(
      d_lnf, at("model.embed_tokens.weight", G), lnf_, at("model.embed_tokens.weight", P), targets,
      N_, H_, c_.vocab_size, scratch_, kLossChunk, scored, grad_scale);
  kernels::rmsnorm_backward(d_rf, at("model.final_norm.weight", G), d_lnf, rf_,
                            at("model.final_norm.weight", P), lnf_rstd_, N_, H_);
  // dr: gradient of the current merged residual; dh: of the current layer output.
  // The merges' backward writes dr and dh (GradStore::write_input), a CCA
  // layer's backward writes dx; the MoE layer's adds to a cleared dx.
  constexpr auto kWrite = kernels::GradStore::write_input;
  float*& dr = back_.dr;
  float*& dh = back_.dh;
  float* dx = back_.dx;
  kernels::residual_merge_backward(
      dr, dh, at("model.res_scale.hidden_states_scale", G),
      at("model.res_scale.hidden_states_bias", G), at("model.res_scale.residual_scale", G),
      at("model.res_scale.residual_bias", G), d_rf, r_[layers_ - 1], h_[layers_ - 1],
      at("model.res_scale.hidden_states_scale", P), at("model.res_scale.hidden_states_bias", P),
      at("model.res_scale.residual_scale", P), at("model.res_scale.residual_bias", P), N_, H_,
      kWrite);
  const std::vector<float*>& drstate = back_.drstate;
  for (float* d : drstate) zeroed(d, N_ * R_);
  for (int64_t n = layers_ - 1; n >= 0; --n) {
    if (n % 2 == 0) {
      cca_[n / 2]->backward(dx, cca_g_[n / 2], dh, x_[n], cca_p_[n / 2]);
    } else {
      const int64_t m = n / 2;
      zeroed(dx, NH);
      moe_[m]->backward(dx, m > 0 ? drstate[m - 1] : nullptr, moe_g_[m], dh, drstate[m], x_[n],
                        m > 0 ? rstate_[m - 1] : nullptr, moe_p_[m], grad_scale);
    }
    kernels::rmsnorm_backward(dr, at(layer_param_name(n, "input_norm.weight"), G), dx, r_[n],
                              at(layer_param_name(n, "input_norm.weight"), P), rstd_[n], N_, H_);
    // r_n = merge(r_{n-1}, h_{n-1}) (n = 0: merge(none, embedding)).
    const std::string p = layer_param_name(n, "res_scale.");
    kernels::residual_merge_backward(back_.dr_prev, back_.dh_prev, at(p + "hidden_states_scale", G),
                                     at(p + "hidden_states_bias", G), at(p + "residual_scale", G),
                                     at(p + "residual_bias", G), dr, n > 0 ? r_[n - 1] : nullptr,
                                     n > 0 ? h_[n - 1] : emb_, at(p + "hidden_states_scale", P),
                                     at(p + "hidden_states_bias", P), at(p + "residual_scale", P),
                                     at(p + "residual_bias", P), N_, H_, kWrite);
    std::swap(dr, back_.dr_prev);
    std::swap(dh, back_.dh_prev);
    grads_ready_from(registry_.layer_begin(n));
  }
  kernels::embedding_backward(at("model.embed_tokens.weight", G), nullptr, dh, tokens, B_, T_, H_);
  grads_ready_from(0);
  return loss;
}

}  // namespace anvil::model
