#include "anvil/model/zaya_model.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

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
      r.add(a + "qkv.temp", {2}, Init::ones);
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

ZayaModel::ZayaModel(const ModelConfig& config, int64_t B, int64_t T, Balancing balancing,
                     ExpertRange experts, Precision precision)
    : c_(config),
      registry_(zaya_registry(config, experts)),
      first_expert_(experts.first),
      balancer_(std::move(balancing), config.n_layers, config.n_experts),
      B_(B),
      T_(T),
      N_(B * T),
      H_(config.d_model),
      R_(config.router_dim),
      layers_(2 * config.n_layers) {
  if (T > config.seq_len) throw InputError("sequence length exceeds the config's seq_len");
  params_.assign(static_cast<size_t>(registry_.total()), 0.0f);
  grads_.assign(static_cast<size_t>(registry_.total()), 0.0f);
  CcaShape cs;
  cs.hidden = H_;
  cs.q_heads = c_.n_heads;
  cs.kv_heads = 2;
  cs.head_dim = c_.head_dim;
  cs.rotary_dim = c_.rotary_dim == 0 ? c_.head_dim : c_.rotary_dim;
  cs.rope_theta = static_cast<float>(c_.rope_theta);
  ZayaMoeShape ms;
  ms.hidden = H_;
  ms.router_dim = R_;
  ms.experts = c_.n_experts;
  ms.expert_ffn = c_.expert_ffn_hidden;
  ms.top_k = c_.top_k;
  ms.norm_eps = static_cast<float>(c_.norm_eps);
  ms.skip_identity = c_.skip_output == SkipOutput::input;
  for (int64_t n = 0; n < layers_; ++n) {
    if (n % 2 == 0) {
      // One backward scratch for all CCA layers, one for all MoE layers: the
      // backward pass runs them one at a time.
      cca_.push_back(
          std::make_unique<CcaLayer>(cs, B, T, cca_.empty() ? nullptr : cca_.front()->scratch()));
    } else {
      moe_.push_back(std::make_unique<ZayaMoeLayer>(
          ms, N_,
          RouterLossCoefs{balancer_.settings().aux_loss_coef, balancer_.settings().z_loss_coef},
          moe_.empty() ? nullptr : moe_.front()->scratch()));
      rstate_.emplace_back(static_cast<size_t>(N_ * R_), 0.0f);
    }
    r_.emplace_back(static_cast<size_t>(N_ * H_), 0.0f);
    x_.emplace_back(static_cast<size_t>(N_ * H_), 0.0f);
    rstd_.emplace_back(static_cast<size_t>(N_), 0.0f);
    h_.emplace_back(static_cast<size_t>(N_ * H_), 0.0f);
  }
  emb_.assign(static_cast<size_t>(N_ * H_), 0.0f);
  rf_.assign(static_cast<size_t>(N_ * H_), 0.0f);
  lnf_.assign(static_cast<size_t>(N_ * H_), 0.0f);
  lnf_rstd_.assign(static_cast<size_t>(N_), 0.0f);
  scratch_.assign(static_cast<size_t>(std::min(N_, kLossChunk) * c_.vocab_size), 0.0f);
  for (int64_t n = 0; n < layers_; ++n) {
    if (n % 2 == 0) {
      cca_p_.push_back(cca_params(n, params_.data()));
      cca_g_.push_back(cca_params(n, grads_.data()));
    } else {
      moe_p_.push_back(moe_params(n, params_.data()));
      moe_g_.push_back(moe_params(n, grads_.data()));
    }
  }
  const size_t K = static_cast<size_t>(c_.n_experts + 1);
  step_load_.assign(moe_.size() * K, 0);
  last_load_.assign(moe_.size(), std::vector<int64_t>(K, 0));
  size_t back_bytes = 0;
  for (auto* v : {&back_.d_lnf, &back_.d_rf, &back_.dr, &back_.dh, &back_.dx, &back_.dr_prev,
                  &back_.dh_prev}) {
    v->assign(static_cast<size_t>(N_ * H_), 0.0f);
    back_bytes += v->size() * sizeof(float);
  }
  back_.drstate.assign(moe_.size(), std::vector<float>(static_cast<size_t>(N_ * R_), 0.0f));
  back_bytes += moe_.size() * static_cast<size_t>(N_ * R_) * sizeof(float);
  // What this model holds: its layers' buffers and the shared backward scratch.
  plan_.parameters = params_.size() * sizeof(float);
  plan_.gradients = grads_.size() * sizeof(float);
  size_t acts = 0;
  for (const auto* group : {&r_, &x_, &rstd_, &h_, &rstate_}) {
    for (const auto& v : *group) acts += v.size() * sizeof(float);
  }
  acts +=
      (emb_.size() + rf_.size() + lnf_.size() + lnf_rstd_.size() + scratch_.size()) * sizeof(float);
  for (const auto& l : cca_) acts += l->bytes();
  for (const auto& l : moe_) acts += l->bytes();
  if (!cca_.empty()) acts += cca_.front()->scratch()->bytes();
  if (!moe_.empty()) acts += moe_.front()->scratch()->bytes();
  acts += back_bytes;
  plan_.activations = acts;
  if (precision == Precision::bf16) {
    // One conversion scratch for every layer (they run one at a time).
    const int64_t capacity =
        std::max(CcaLayer::bf16_scratch(cs, N_), experts_bf16_scratch(ms, N_ * c_.top_k));
    low_.resize(params_.size());
    low_a_.resize(static_cast<size_t>(capacity));
    low_b_.resize(static_cast<size_t>(capacity));
    low_weights_ = {params_.data(), low_.data()};
    low_scratch_ = {low_a_.data(), low_b_.data(), capacity};
    for (auto& l : cca_) l->set_bf16(&low_weights_, &low_scratch_);
    for (auto& l : moe_) l->set_bf16(&low_weights_, &low_scratch_);
    plan_.low_precision = (low_.size() + low_a_.size() + low_b_.size()) * sizeof(bf16);
  }
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

void ZayaModel::set_expert_dispatchers(const ExpertDispatcherFactory& make) {
  for (auto& layer : moe_) {
    plan_.activations -= layer->dispatcher().bytes();
    layer->set_dispatcher(make(layer->shape(), layer->assignments()));
    plan_.activations += layer->dispatcher().bytes();
  }
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
                      {"max_over_min", lo > 0 ? static_cast<double>(hi) / lo : -1.0},
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
    const double r = l["max_over_min"].get<double>();
    if (r < 0) empty = true;
    worst = std::max(worst, r);
    skip += l["skip_rate"].get<double>();
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "load max/min %s | skip %.1f%%",
                empty ? "inf" : (std::to_string(worst).substr(0, 4)).c_str(),
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
  return {at(a + "down_proj.weight", base),    at(a + "down_proj.bias", base),
          at(a + "router_states_scale", base), at(a + "rmsnorm_eda.weight", base),
          at(a + "router_mlp.0.weight", base), at(a + "router_mlp.0.bias", base),
          at(a + "router_mlp.2.weight", base), at(a + "router_mlp.2.bias", base),
          at(a + "router_mlp.4.weight", base), at(ex + "linear_fc1.weight", base),
          at(ex + "linear_fc2.weight", base)};
}

void ZayaModel::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void ZayaModel::run_forward(const int32_t* tokens) {
  for (int64_t i = 0; i < N_; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c_.vocab_size)
      throw InputError("token outside the vocabulary");
  }
  if (!low_.empty() && low_stale_) {
    kernels::convert_to_bf16(low_.data(), params_.data(), registry_.total());
    low_stale_ = false;
  }
  float* P = params_.data();
  const auto eps = static_cast<float>(c_.norm_eps);
  kernels::embedding_forward(emb_.data(), tokens, at("model.embed_tokens.weight", P), nullptr, B_,
                             T_, H_);
  const float* h = emb_.data();
  const float* r = nullptr;
  for (int64_t n = 0; n < layers_; ++n) {
    const std::string p = layer_param_name(n, "res_scale.");
    kernels::residual_merge_forward(r_[n].data(), r, h, at(p + "hidden_states_scale", P),
                                    at(p + "hidden_states_bias", P), at(p + "residual_scale", P),
                                    at(p + "residual_bias", P), N_, H_);
    kernels::rmsnorm_forward(x_[n].data(), rstd_[n].data(), r_[n].data(),
                             at(layer_param_name(n, "input_norm.weight"), P), N_, H_, eps);
    if (n % 2 == 0 && decode_pos_ >= 0) {
      cca_[n / 2]->decode_step(h_[n].data(), x_[n].data(), cca_p_[n / 2], decode_pos_);
    } else if (n % 2 == 0) {
      cca_[n / 2]->forward(h_[n].data(), x_[n].data(), cca_p_[n / 2]);
    } else {
      const int64_t m = n / 2;
      moe_[m]->forward(h_[n].data(), rstate_[m].data(), x_[n].data(),
                       m > 0 ? rstate_[m - 1].data() : nullptr, moe_p_[m],
                       balancer_.biases(static_cast<int64_t>(m)));
    }
    h = h_[n].data();
    r = r_[n].data();
  }
  kernels::residual_merge_forward(rf_.data(), r, h, at("model.res_scale.hidden_states_scale", P),
                                  at("model.res_scale.hidden_states_bias", P),
                                  at("model.res_scale.residual_scale", P),
                                  at("model.res_scale.residual_bias", P), N_, H_);
  kernels::rmsnorm_forward(lnf_.data(), lnf_rstd_.data(), rf_.data(),
                           at("model.final_norm.weight", P), N_, H_, eps);
}

void ZayaModel::start_decode(int64_t max_len) {
  if (N_ != 1) throw InputError("ZAYA1 decode: the model must be built for B = 1, T = 1");
  if (max_len < 1 || max_len > c_.seq_len)
    throw InputError("ZAYA1 decode: max_len must be in 1.." + std::to_string(c_.seq_len));
  for (auto& layer : cca_) layer->start_decode(max_len);
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
  return kernels::classifier_loss(nullptr, nullptr, lnf_.data(),
                                  at("model.embed_tokens.weight", params_.data()), targets, N_, H_,
                                  c_.vocab_size, scratch_.data(), kLossChunk, scored, 0.0f);
}

void ZayaModel::logits(float* out) {
  device::gemm(false, true, N_, c_.vocab_size, H_, 1.0f, lnf_.data(), H_,
                at("model.embed_tokens.weight", params_.data()), H_, 0.0f, out, c_.vocab_size);
}

double ZayaModel::forward_backward(const int32_t* tokens, const int32_t* targets, float grad_scale,
                                   int64_t* scored) {
  run_forward(tokens);
  float* P = params_.data();
  float* G = grads_.data();
  // Backward's buffers live as long as the model: no allocation (and no page
  // faults) per step. zeroed(v, n) sizes once, then clears.
  const auto zeroed = [](std::vector<float>& v, int64_t n) -> std::vector<float>& {
    if (v.size() != static_cast<size_t>(n)) {
      v.assign(static_cast<size_t>(n), 0.0f);
    } else {
      std::fill(v.begin(), v.end(), 0.0f);
    }
    return v;
  };
  std::vector<float>& d_lnf = zeroed(back_.d_lnf, N_ * H_);
  std::vector<float>& d_rf = zeroed(back_.d_rf, N_ * H_);
  const double loss =
      kernels::classifier_loss(d_lnf.data(), at("model.embed_tokens.weight", G), lnf_.data(),
                               at("model.embed_tokens.weight", P), targets, N_, H_, c_.vocab_size,
                               scratch_.data(), kLossChunk, scored, grad_scale);
  kernels::rmsnorm_backward(d_rf.data(), at("model.final_norm.weight", G), d_lnf.data(), rf_.data(),
                            at("model.final_norm.weight", P), lnf_rstd_.data(), N_, H_);
  // dr: gradient of the current merged residual; dh: of the current layer output.
  std::vector<float>& dr = zeroed(back_.dr, N_ * H_);
  std::vector<float>& dh = zeroed(back_.dh, N_ * H_);
  std::vector<float>& dx = back_.dx;
  dx.resize(static_cast<size_t>(N_ * H_));
  kernels::residual_merge_backward(
      dr.data(), dh.data(), at("model.res_scale.hidden_states_scale", G),
      at("model.res_scale.hidden_states_bias", G), at("model.res_scale.residual_scale", G),
      at("model.res_scale.residual_bias", G), d_rf.data(), r_[layers_ - 1].data(),
      h_[layers_ - 1].data(), at("model.res_scale.hidden_states_scale", P),
      at("model.res_scale.hidden_states_bias", P), at("model.res_scale.residual_scale", P),
      at("model.res_scale.residual_bias", P), N_, H_);
  std::vector<std::vector<float>>& drstate = back_.drstate;
  drstate.resize(moe_.size());
  for (auto& d : drstate) zeroed(d, N_ * R_);
  for (int64_t n = layers_ - 1; n >= 0; --n) {
    std::fill(dx.begin(), dx.end(), 0.0f);
    if (n % 2 == 0) {
      cca_[n / 2]->backward(dx.data(), cca_g_[n / 2], dh.data(), x_[n].data(), cca_p_[n / 2]);
    } else {
      const int64_t m = n / 2;
      moe_[m]->backward(dx.data(), m > 0 ? drstate[m - 1].data() : nullptr, moe_g_[m], dh.data(),
                        drstate[m].data(), x_[n].data(), m > 0 ? rstate_[m - 1].data() : nullptr,
                        moe_p_[m], grad_scale);
    }
    kernels::rmsnorm_backward(dr.data(), at(layer_param_name(n, "input_norm.weight"), G), dx.data(),
                              r_[n].data(), at(layer_param_name(n, "input_norm.weight"), P),
                              rstd_[n].data(), N_, H_);
    // r_n = merge(r_{n-1}, h_{n-1}) (n = 0: merge(none, embedding)).
    const std::string p = layer_param_name(n, "res_scale.");
    std::vector<float>& dr_prev = zeroed(back_.dr_prev, N_ * H_);
    std::vector<float>& dh_prev = zeroed(back_.dh_prev, N_ * H_);
    kernels::residual_merge_backward(
        dr_prev.data(), dh_prev.data(), at(p + "hidden_states_scale", G),
        at(p + "hidden_states_bias", G), at(p + "residual_scale", G), at(p + "residual_bias", G),
        dr.data(), n > 0 ? r_[n - 1].data() : nullptr, n > 0 ? h_[n - 1].data() : emb_.data(),
        at(p + "hidden_states_scale", P), at(p + "hidden_states_bias", P),
        at(p + "residual_scale", P), at(p + "residual_bias", P), N_, H_);
    dr.swap(dr_prev);
    dh.swap(dh_prev);
    grads_ready_from(registry_.layer_begin(n));
  }
  kernels::embedding_backward(at("model.embed_tokens.weight", G), nullptr, dh.data(), tokens, B_,
                              T_, H_);
  grads_ready_from(0);
  return loss;
}

}  // namespace anvil::model
