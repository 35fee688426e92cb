// The dense decoder on a device: decoder.cpp's passes, step for step, over
// device memory, with the GEMMs on a GemmEngine and the other layers in
// kernels/device_layers.hpp.
#include "anvil/model/device_decoder.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "anvil/base/env_choice.hpp"
#include "anvil/base/error.hpp"
#include "anvil/kernels/device_layers.hpp"
#include "anvil/model/decoder.hpp"

namespace anvil::model {
namespace {

namespace dev = kernels::dev;

// Classifier rows per chunk: the V-wide logits exist for this many rows.
constexpr int64_t kChunk = 1024;

struct Sizes {
  int64_t L, N, T, C, Hq, Q, A, F, F2, V, chunk;
  bool training;
  bool gelu_in_epilogue;  // backward needs no separate gradient of the activation
};

Sizes sizes(const ModelConfig& c, int64_t B, int64_t T, bool training) {
  const int64_t Q = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
  const int64_t F2 = c.mlp == Mlp::swiglu ? 2 * c.ffn_hidden : c.ffn_hidden;
  return {c.n_layers,
          B * T,
          T,
          c.d_model,
          c.n_heads,
          Q,
          c.n_heads * c.head_dim,
          c.ffn_hidden,
          F2,
          c.vocab_size,
          std::min(B * T, kChunk),
          training,
          DeviceDecoder::gelu_in_epilogue(c)};
}

// The activation buffers in carving order; `take(n)` returns n floats (4-byte
// elements: the token and target rows are int32). One function defines both
// the plan and the memory.
template <typename Take>
void layout(Take take, const Sizes& s, std::vector<float*>* x,
            std::vector<std::array<float*, 12>>* layers, std::array<float*, 18>* rest) {
  const int64_t N = s.N;
  for (int64_t l = 0; l <= s.L; ++l) x->push_back(take(N * s.C));
  for (int64_t l = 0; l < s.L; ++l) {
    if (!s.training && l > 0) {  // inference keeps one layer's activations
      layers->push_back(layers->front());
      continue;
    }
    layers->push_back({take(N * s.C), take(N), take(N), take(N * s.Q), take(N * s.A),
                       take(s.Hq * N), take(N * s.C), take(N * s.C), take(N), take(N),
                       take(N * s.F2), take(N * s.F)});
  }
  const int64_t per_row_scores = s.N * s.T;         // one head's batch rows at a time
  (*rest)[0] = take(N * s.C);                       // lnf
  (*rest)[1] = take(N);
  (*rest)[2] = take(N);
  (*rest)[3] = take(s.chunk * s.V);  // logits
  (*rest)[4] = take(N);              // row losses
  (*rest)[5] = take(per_row_scores);
  (*rest)[6] = take(N);  // tokens (int32)
  (*rest)[7] = take(N);  // targets (int32)
  if (s.training) {
    (*rest)[8] = take(per_row_scores);  // score gradients
    (*rest)[9] = take(N * s.C);         // d_res
    (*rest)[10] = take(N * s.C);        // d_ln
    (*rest)[11] = take(N * s.Q);
    (*rest)[12] = take(N * s.A);
    (*rest)[13] = take(N * s.F2);
    if (!s.gelu_in_epilogue) (*rest)[14] = take(N * s.F);  // the activation's output gradient
    (*rest)[15] = take(N * s.C);  // d_lnf
    // The GPU's column sums of bias and norm gradients, and the rows
    // grouped by token for the embedding's (int32).
    (*rest)[16] = take(kernels::dev::column_sum_scratch(std::max({s.Q, s.F2, 2 * s.C})));
    (*rest)[17] = take(3 * N + 1);
  }
}

size_t activation_bytes(const Sizes& s) {
  device::ArenaPlan plan;
  std::vector<float*> x;
  std::vector<std::array<float*, 12>> layers;
  std::array<float*, 18> rest{};
  layout(
      [&](int64_t n) -> float* {
        plan.add(static_cast<size_t>(n) * sizeof(float));
        return nullptr;
      },
      s, &x, &layers, &rest);
  return plan.total();
}

// Elements in each bf16 scratch buffer: the widest linear input or output
// over N rows, or a classifier chunk's input rows and logits.
int64_t scratch_elements(const Sizes& s) {
  const int64_t width = std::max({s.C, s.Q, s.A, s.F2});
  return std::max(s.N * width, s.chunk * std::max(s.C, s.V));
}

size_t param_bytes(const ParamRegistry& r) {
  return device::ArenaPlan::rounded(static_cast<size_t>(r.total()) * sizeof(float));
}

// The bf16 arena: the weights' copy, two GEMM scratch buffers and, with
// fused attention, its bf16 qkv and out (and for the backward dout and
// dqkv). cuDNN's workspace is FusedAttention's own allocation: the plan
// counts it beside the arena.
device::ArenaPlan low_precision_arena(const ParamRegistry& r, const Sizes& s, bool training,
                                      bool fused_attention) {
  device::ArenaPlan low;
  low.add(static_cast<size_t>(r.total()) * sizeof(bf16));
  for (int i = 0; i < 2; ++i) low.add(static_cast<size_t>(scratch_elements(s)) * sizeof(bf16));
  if (fused_attention) {
    for (int i = 0; i < (training ? 2 : 1); ++i)
      for (const int64_t width : {s.Q, s.A})
        low.add(static_cast<size_t>(s.N * width) * sizeof(bf16));
  }
  return low;
}

device::ArenaPlan one_request(size_t bytes) {
  device::ArenaPlan plan;
  plan.add(bytes);
  return plan;
}

}  // namespace

bool DeviceDecoder::fuses_attention(device::DeviceKind kind, Precision precision) {
  const std::string choice = env_choice("ANVIL_ATTENTION", {"auto", "fused", "unfused"});
  if (choice == "unfused" || precision != Precision::bf16) return false;
  const std::string why = kind == device::DeviceKind::cuda
                              ? device::fused_attention_unavailable()
                              : std::string("the CPU device has no fused attention");
  if (why.empty()) return true;
  if (choice == "fused") throw InputError("ANVIL_ATTENTION=fused: " + why);
  return false;
}

MemoryPlan DeviceDecoder::plan_for(const ModelConfig& config, int64_t B, int64_t T, bool training,
                                   Precision precision, bool fused_attention) {
  MemoryPlan p;
  const ParamRegistry r = decoder_registry(config);
  p.parameters = param_bytes(r);
  p.gradients = training ? p.parameters : 0;
  const Sizes s = sizes(config, B, T, training);
  p.activations = activation_bytes(s);
  if (precision == Precision::bf16) {
    p.low_precision = low_precision_arena(r, s, training, fused_attention).total();
    // and cuDNN's workspace, allocated when the graphs are first built
    if (fused_attention)
      p.low_precision += device::fused_attention_workspace_bound(
          {B, T, config.n_heads, config.n_kv_heads, config.head_dim});
  }
  return p;
}

DeviceDecoder::DeviceDecoder(const ModelConfig& config, int64_t B, int64_t T, bool training,
                             device::DeviceKind kind, Precision precision, bool tf32)
    : config_(config),
      registry_(decoder_registry(config)),
      plan_(plan_for(config, B, T, training, precision, fuses_attention(kind, precision))),
      B_(B),
      T_(T),
      C_(config.d_model),
      Hq_(config.n_heads),
      Hkv_(config.n_kv_heads),
      D_(config.head_dim),
      Q_((config.n_heads + 2 * config.n_kv_heads) * config.head_dim),
      F_(config.ffn_hidden),
      F2_(config.mlp == Mlp::swiglu ? 2 * config.ffn_hidden : config.ffn_hidden),
      V_(config.vocab_size),
      L_(config.n_layers),
      rotary_(config.rotary_dim == 0 ? config.head_dim : config.rotary_dim),
      chunk_(std::min(B * T, kChunk)),
      training_(training),
      gemm_type_(tf32 && kind == device::DeviceKind::cuda ? Dtype::tf32 : Dtype::fp32),
      stream_((device::require(kind, "--device"), kind)),
      engine_(device::make_gemm_engine(kind)) {
  if (T > config.seq_len) {
    throw InputError("sequence length " + std::to_string(T) + " exceeds the config's seq_len " +
                     std::to_string(config.seq_len));
  }
  params_ = device::DeviceArena(kind, "parameters", one_request(plan_.parameters));
  if (training) grads_ = device::DeviceArena(kind, "gradients", one_request(plan_.gradients));
  const Sizes s = sizes(config, B, T, training);
  device::ArenaPlan act_plan;
  act_plan.add(plan_.activations);
  acts_ = device::DeviceArena(kind, "activations", act_plan);
  std::vector<std::array<float*, 12>> layers;
  std::array<float*, 18> rest{};
  layout([&](int64_t n) { return acts_.take<float>(n); }, s, &x_, &layers, &rest);
  for (const auto& a : layers)
    acts_by_layer_.push_back(
        {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]});
  lnf_ = rest[0];
  lnf_mean_ = rest[1];
  lnf_rstd_ = rest[2];
  logits_ = rest[3];
  row_loss_ = rest[4];
  scores_ = rest[5];
  tokens_ = reinterpret_cast<int32_t*>(rest[6]);
  targets_ = reinterpret_cast<int32_t*>(rest[7]);
  dscores_ = rest[8];
  d_res_ = rest[9];
  d_ln_ = rest[10];
  d_qkv_ = rest[11];
  d_att_ = rest[12];
  d_fch_ = rest[13];
  d_fca_ = rest[14];
  column_scratch_ = rest[16];
  groups_ = reinterpret_cast<int32_t*>(rest[17]);
  d_lnf_ = rest[15];
  dparams_ = params_.take<float>(registry_.total());
  if (training) dgrads_ = grads_.take<float>(registry_.total());
  for (int64_t l = 0; l < L_; ++l) {
    param_layers_.push_back(layer(l, dparams_));
    if (training) grad_layers_.push_back(layer(l, dgrads_));
  }
  if (precision == Precision::bf16) {
    low_ = device::DeviceArena(
        kind, "bf16 weights and scratch",
        low_precision_arena(registry_, s, training, fuses_attention(kind, precision)));
    weights_bf16_ = low_.take<bf16>(registry_.total());
    scratch_a_ = low_.take<bf16>(scratch_elements(s));
    scratch_b_ = low_.take<bf16>(scratch_elements(s));
    if (fuses_attention(kind, precision)) {
      qkv16_ = low_.take<bf16>(s.N * s.Q);
      out16_ = low_.take<bf16>(s.N * s.A);
      if (training) {
        dout16_ = low_.take<bf16>(s.N * s.A);
        dqkv16_ = low_.take<bf16>(s.N * s.Q);
      }
    }
  }
  const auto n = static_cast<size_t>(registry_.total());
  const auto host = [kind](size_t floats, const char* name) {
    return HostFloats{
        device::DeviceBuffer(kind, floats * sizeof(float), name, device::Memory::pinned_host),
        floats};
  };
  host_params_ = host(n, "host parameters");
  if (training) host_grads_ = host(n, "host gradients");
  host_row_loss_ = host(static_cast<size_t>(B * T), "host row losses");
  loss_copied_ = device::Event(kind);
  if (training) zero_grads();
  arrays_ = {&stream_, dparams_, dgrads_};
}

DeviceDecoder::~DeviceDecoder() = default;

float* DeviceDecoder::params_for_reading() {
  if (host_params_behind_) {
    device::copy(host_params_.data(), dparams_, host_params_.size() * sizeof(float),
                 device::CopyKind::device_to_host, stream_);
    stream_.synchronize();
    host_params_behind_ = false;
  }
  return host_params_.data();
}

float* DeviceDecoder::params() {
  float* p = params_for_reading();
  params_stale_ = true;  // the caller may write them
  return p;
}

float* DeviceDecoder::grads() {
  if (grads_on_device_) {
    device::copy(host_grads_.data(), dgrads_, host_grads_.size() * sizeof(float),
                 device::CopyKind::device_to_host, stream_);
    stream_.synchronize();
  }
  return host_grads_.data();
}

void DeviceDecoder::params_written_on_device() {
  host_params_behind_ = true;
  params_stale_ = false;
  if (mixed()) dev::convert_to_bf16(stream_, weights_bf16_, dparams_, registry_.total());
}

const float* DeviceDecoder::param(const std::string& name, const float* base) const {
  const ParamSpec* s = registry_.find(name);
  return s == nullptr || base == nullptr ? nullptr : base + s->offset;
}

DeviceDecoder::Layer DeviceDecoder::layer(int64_t l, const float* base) const {
  const bool swiglu = config_.mlp == Mlp::swiglu;
  auto p = [&](const char* rest) { return param(layer_param_name(l, rest), base); };
  return {p("input_layernorm.weight"),
          p("input_layernorm.bias"),
          p("self_attn.q_proj.weight"),
          p("self_attn.q_proj.bias"),
          p("self_attn.o_proj.weight"),
          p("self_attn.o_proj.bias"),
          p("post_attention_layernorm.weight"),
          p("post_attention_layernorm.bias"),
          p(swiglu ? "mlp.gate_proj.weight" : "mlp.up_proj.weight"),
          p(swiglu ? "mlp.gate_proj.bias" : "mlp.up_proj.bias"),
          p("mlp.down_proj.weight"),
          p("mlp.down_proj.bias")};
}

void DeviceDecoder::zero_grads() {
  if (!training_) return;
  if (!grads_on_device_)
    std::fill(host_grads_.data(), host_grads_.data() + host_grads_.size(), 0.0f);
  device::zero(dgrads_, static_cast<size_t>(registry_.total()) * sizeof(float), stream_);
}

void DeviceDecoder::upload_params() {
  if (!params_stale_) return;
  device::copy(dparams_, host_params_.data(), host_params_.size() * sizeof(float),
               device::CopyKind::host_to_device, stream_);
  if (mixed()) dev::convert_to_bf16(stream_, weights_bf16_, dparams_, registry_.total());
  params_stale_ = false;
}

void DeviceDecoder::check_batch(const int32_t* tokens, const int32_t* targets, int64_t B,
                                int64_t T) const {
  check_forward_batch(tokens, B, T, B_, T_, V_);
  for (int64_t i = 0; i < B * T; ++i) {
    // A kernel must never index logits[target] past the row (negative: not scored).
    if (targets[i] >= V_) {
      throw std::out_of_range("classifier: target " + std::to_string(targets[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " +
                              std::to_string(V_) + ")");
    }
  }
}

void DeviceDecoder::upload_batch(const int32_t* tokens, const int32_t* targets, int64_t N,
                                 bool backward) {
  const size_t bytes = static_cast<size_t>(N) * sizeof(int32_t);
  device::copy(tokens_, tokens, bytes, device::CopyKind::host_to_device, stream_);
  device::copy(targets_, targets, bytes, device::CopyKind::host_to_device, stream_);
  if (backward && stream_.kind() != device::DeviceKind::cpu) {
    dev::group_by_token(tokens, N, &token_groups_);
    device::copy(groups_, token_groups_.packed.data(),
                 token_groups_.packed.size() * sizeof(int32_t), device::CopyKind::host_to_device,
                 stream_);
  }
}

void DeviceDecoder::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
                         int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc,
                         Dtype type, Batch batch, device::Epilogue epilogue, const float* aux) {
  device::GemmDesc d;
  d.batch = batch.count;
  d.stride_a = batch.a;
  d.stride_b = batch.b;
  d.stride_c = batch.c;
  d.trans_a = ta;
  d.trans_b = tb;
  d.m = m;
  d.n = n;
  d.k = k;
  d.lda = lda;
  d.ldb = ldb;
  d.ldc = ldc;
  d.type = type;
  d.beta = beta;
  d.epilogue = epilogue;
  engine_->run(d, a, b, c, nullptr, stream_, -1, const_cast<float*>(aux));
}

void DeviceDecoder::linear_forward(float* out, const float* inp, const float* w, const float* bias,
                                   int64_t N, int64_t IC, int64_t OC, float* gelu_input) {
  device::GemmDesc d;
  d.trans_b = true;
  d.m = N;
  d.n = OC;
  d.k = IC;
  d.type = gemm_type_;
  d.epilogue = bias != nullptr ? device::Epilogue::bias : device::Epilogue::none;
  if (gelu_input != nullptr) d.epilogue = device::Epilogue::bias_gelu_aux;
  if (!mixed()) {
    engine_->run(d, inp, w, out, bias, stream_, -1, gelu_input);
    return;
  }
  dev::convert_to_bf16(stream_, scratch_a_, inp, N * IC);
  d.type = Dtype::bf16;
  engine_->run(d, scratch_a_, low(w), out, bias, stream_, -1, gelu_input);
}

void DeviceDecoder::linear_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                    const float* inp, const float* w, int64_t N, int64_t IC,
                                    int64_t OC, const float* gelu_input) {
  const auto epilogue = gelu_input != nullptr ? device::Epilogue::dgelu : device::Epilogue::none;
  const Batch one{1, 0, 0, 0};
  if (mixed()) {
    dev::convert_to_bf16(stream_, scratch_b_, dout, N * OC);
    dev::convert_to_bf16(stream_, scratch_a_, inp, N * IC);
    if (dinp != nullptr) {
      gemm(false, false, N, IC, OC, scratch_b_, OC, low(w), IC, 0.0f, dinp, IC, Dtype::bf16, one,
           epilogue, gelu_input);
    }
    gemm(true, false, OC, IC, N, scratch_b_, OC, scratch_a_, IC, 1.0f, dw, IC, Dtype::bf16);
  } else {
    if (dinp != nullptr) {
      gemm(false, false, N, IC, OC, dout, OC, w, IC, 0.0f, dinp, IC, gemm_type_, one, epilogue,
           gelu_input);
    }
    gemm(true, false, OC, IC, N, dout, OC, inp, IC, 1.0f, dw, IC, gemm_type_);
  }
  if (dbias != nullptr) dev::bias_backward(stream_, dbias, dout, N, OC, column_scratch_);
}

void DeviceDecoder::mlp_up(const Layer& p, const Acts& a, int64_t N) {
  if (gelu_in_epilogue(config_)) {
    linear_forward(a.fca, a.ln2, p.up_w, p.up_b, N, C_, F2_, a.fch);
    return;
  }
  linear_forward(a.fch, a.ln2, p.up_w, p.up_b, N, C_, F2_);
  if (config_.mlp == Mlp::swiglu)
    dev::swiglu_forward(stream_, a.fca, a.fch, N, F_);
  else
    dev::gelu_forward(stream_, a.fca, a.fch, N * F_);
}

void DeviceDecoder::norm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int64_t N) {
  const auto eps = static_cast<float>(config_.norm_eps);
  if (config_.norm == Norm::layernorm)
    dev::layernorm_forward(stream_, out, mean, rstd, inp, w, b, N, C_, eps);
  else
    dev::rmsnorm_forward(stream_, out, rstd, inp, w, N, C_, eps);
}

void DeviceDecoder::norm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int64_t N) {
  if (config_.norm == Norm::layernorm)
    dev::layernorm_backward(stream_, dinp, dw, db, dout, inp, w, mean, rstd, N, C_,
                            column_scratch_);
  else
    dev::rmsnorm_backward(stream_, dinp, dw, dout, inp, w, rstd, N, C_, column_scratch_);
}

void DeviceDecoder::rope(float* x, int64_t N, int64_t T, bool backward) {
  const auto theta = static_cast<float>(config_.rope_theta);
  dev::rope(stream_, x, N, T, 0, Hq_, D_, rotary_, Q_, theta, backward);
  dev::rope(stream_, x + Hq_ * D_, N, T, 0, Hkv_, D_, rotary_, Q_, theta, backward);
}

// Per batch row: S_h = Q_h K_g^T (T x T, one block per head), the causal
// softmax in place, then out_h = P_h V_g. Query head h reads kv head
// g = h / (Hq / Hkv).
device::FusedAttention* DeviceDecoder::fused_attention(int64_t B, int64_t T) {
  if (qkv16_ == nullptr) return nullptr;
  const auto key = std::make_pair(B, T);
  if (const auto it = fused_by_shape_.find(key); it != fused_by_shape_.end())
    return it->second.get();
  auto& slot = fused_by_shape_[key];  // stays null when cuDNN has no plan for the shape
  try {
    slot = std::make_unique<device::FusedAttention>(
        device::AttentionShape{B, T, Hq_, Hkv_, D_, 1.0f / std::sqrt(static_cast<float>(D_))},
        stream_);
  } catch (const SystemError& e) {
    if (env_choice("ANVIL_ATTENTION", {"auto", "fused", "unfused"}) == "fused") throw;
    std::fprintf(stderr, "anvil: warning: %s; attention for %lld x %lld tokens runs unfused\n",
                 e.what(), static_cast<long long>(B), static_cast<long long>(T));
  }
  return slot.get();
}

void DeviceDecoder::attention_forward(const Acts& a, int64_t B, int64_t T) {
  const int64_t A = Hq_ * D_, group = Hq_ / Hkv_;
  if (device::FusedAttention* fused = fused_attention(B, T)) {  // bf16 q, k, v, out; fp32 lse
    dev::convert_to_bf16(stream_, qkv16_, a.qkv, B * T * Q_);
    fused->forward(qkv16_, out16_, a.lse);
    dev::convert_from_bf16(stream_, a.att, out16_, B * T * A);
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D_));
  // One head at a time, its B batch rows as one strided batch (qkv rows
  // T Q apart, scores T^2 apart): 2 GEMM launches per head, any GQA group.
  for (int64_t h = 0; h < Hq_; ++h) {
    const float* q = a.qkv + h * D_;
    const float* k = a.qkv + (Hq_ + h / group) * D_;
    const float* v = a.qkv + (Hq_ + Hkv_ + h / group) * D_;
    gemm(false, true, T, T, D_, q, Q_, k, Q_, 0.0f, scores_, T, gemm_type_,
         {B, T * Q_, T * Q_, T * T});
    dev::causal_softmax_forward(stream_, scores_, a.lse + h * B * T, B * T, T, scale);
    gemm(false, false, T, D_, T, scores_, T, v, Q_, 0.0f, a.att + h * D_, A, gemm_type_,
         {B, T * T, T * Q_, T * A});
  }
}

// dP = dO V^T; dS = P (dP - rowsum(P dP)) * scale; dQ = dS K; dK += dS^T Q;
// dV += P^T dO, with P recomputed as the forward computed it; per head, its
// B batch rows as one strided batch.
void DeviceDecoder::attention_backward(const Acts& a, const float* datt, float* dqkv, int64_t B,
                                       int64_t T) {
  const int64_t A = Hq_ * D_, group = Hq_ / Hkv_;
  device::FusedAttention* fused = fused_attention(B, T);  // as the forward ran
  if (fused != nullptr && dqkv16_ != nullptr) {  // the forward's bf16 inputs again (att is bf16)
    dev::convert_to_bf16(stream_, qkv16_, a.qkv, B * T * Q_);
    dev::convert_to_bf16(stream_, out16_, a.att, B * T * A);
    dev::convert_to_bf16(stream_, dout16_, datt, B * T * A);
    fused->backward(qkv16_, out16_, dout16_, a.lse, dqkv16_);
    dev::convert_from_bf16(stream_, dqkv, dqkv16_, B * T * Q_);
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D_));
  device::zero(dqkv, static_cast<size_t>(B * T * Q_) * sizeof(float), stream_);
  const Batch rows{B, T * Q_, T * Q_, T * T};  // [T, Q] row blocks -> [T, T] score blocks
  for (int64_t h = 0; h < Hq_; ++h) {
    const int64_t g = h / group;
    const float* q = a.qkv + h * D_;
    const float* k = a.qkv + (Hq_ + g) * D_;
    const float* v = a.qkv + (Hq_ + Hkv_ + g) * D_;
    const float* dout = datt + h * D_;
    gemm(false, true, T, T, D_, q, Q_, k, Q_, 0.0f, scores_, T, gemm_type_, rows);
    gemm(false, true, T, T, D_, dout, A, v, Q_, 0.0f, dscores_, T, gemm_type_,
         {B, T * A, T * Q_, T * T});
    dev::causal_softmax_forward(stream_, scores_, a.lse + h * B * T, B * T, T, scale);
    dev::causal_softmax_backward(stream_, dscores_, scores_, B * T, T, scale);
    // [T, T] score blocks times [T, Q] row blocks into [T, Q] row blocks.
    const Batch into_rows{B, T * T, T * Q_, T * Q_};
    gemm(false, false, T, D_, T, dscores_, T, k, Q_, 0.0f, dqkv + h * D_, Q_, gemm_type_,
         into_rows);
    gemm(true, false, T, D_, T, dscores_, T, q, Q_, 1.0f, dqkv + (Hq_ + g) * D_, Q_, gemm_type_,
         into_rows);
    gemm(true, false, T, D_, T, scores_, T, dout, A, 1.0f, dqkv + (Hq_ + Hkv_ + g) * D_, Q_,
         gemm_type_, {B, T * T, T * A, T * Q_});
  }
}

void DeviceDecoder::run_forward(int64_t B, int64_t T) {
  const int64_t N = B * T;
  const float* P = dparams_;
  dev::embedding_forward(stream_, x_[0], tokens_, param("model.embed_tokens.weight", P),
                         param("model.embed_positions.weight", P), B, T, C_);
  for (int64_t l = 0; l < L_; ++l) {
    const Layer& p = param_layers_[static_cast<size_t>(l)];
    const Acts& a = acts_by_layer_[static_cast<size_t>(l)];
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_[l], p.ln1_w, p.ln1_b, N);
    linear_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C_, Q_);
    if (config_.position == Position::rope) rope(a.qkv, N, T, false);
    attention_forward(a, B, T);
    linear_forward(a.mid, a.att, p.o_w, p.o_b, N, Hq_ * D_, C_);
    dev::residual_forward(stream_, a.mid, a.mid, x_[l], N * C_);
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, p.ln2_w, p.ln2_b, N);
    mlp_up(p, a, N);
    linear_forward(x_[l + 1], a.fca, p.down_w, p.down_b, N, F_, C_);
    dev::residual_forward(stream_, x_[l + 1], x_[l + 1], a.mid, N * C_);
  }
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x_[L_], param("model.norm.weight", P),
               param("model.norm.bias", P), N);
}

void DeviceDecoder::classifier(float* dx, int64_t N, float grad_scale) {
  const char* name = config_.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  const float* w = param(name, dparams_);
  float* dw = dx != nullptr ? const_cast<float*>(param(name, dgrads_)) : nullptr;
  for (int64_t r0 = 0; r0 < N; r0 += chunk_) {
    const int64_t rows = std::min(chunk_, N - r0);
    const float* x = lnf_ + r0 * C_;
    if (mixed()) {
      dev::convert_to_bf16(stream_, scratch_a_, x, rows * C_);
      gemm(false, true, rows, V_, C_, scratch_a_, C_, low(w), C_, 0.0f, logits_, V_, Dtype::bf16);
    } else {
      gemm(false, true, rows, V_, C_, x, C_, w, C_, 0.0f, logits_, V_, gemm_type_);
    }
    dev::cross_entropy(stream_, logits_, row_loss_ + r0, targets_ + r0, rows, V_,
                       dx != nullptr ? grad_scale : 0.0f);
    if (dx == nullptr) continue;
    if (mixed()) {
      dev::convert_to_bf16(stream_, scratch_b_, logits_, rows * V_);
      gemm(false, false, rows, C_, V_, scratch_b_, V_, low(w), C_, 0.0f, dx + r0 * C_, C_,
           Dtype::bf16);
      gemm(true, false, V_, C_, rows, scratch_b_, V_, scratch_a_, C_, 1.0f, dw, C_, Dtype::bf16);
    } else {
      gemm(false, false, rows, C_, V_, logits_, V_, w, C_, 0.0f, dx + r0 * C_, C_, gemm_type_);
      gemm(true, false, V_, C_, rows, logits_, V_, x, C_, 1.0f, dw, C_, gemm_type_);
    }
  }
  device::copy(host_row_loss_.data(), row_loss_, static_cast<size_t>(N) * sizeof(float),
               device::CopyKind::device_to_host, stream_);
  loss_copied_.record(stream_);
}

double DeviceDecoder::summed_loss(int64_t N) {
  loss_copied_.synchronize();
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) loss += host_row_loss_.data()[n];
  return loss;
}

double DeviceDecoder::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                              int64_t* scored) {
  check_batch(tokens, targets, B, T);
  upload_params();
  upload_batch(tokens, targets, B * T, /*backward=*/false);
  run_forward(B, T);
  classifier(nullptr, B * T, 0.0f);
  const double loss = summed_loss(B * T);
  if (scored != nullptr)
    *scored = std::count_if(targets, targets + B * T, [](int32_t t) { return t >= 0; });
  return loss;
}

double DeviceDecoder::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                       int64_t T, float grad_scale, int64_t* scored) {
  if (!training_) throw InputError("forward_backward on a decoder built for inference");
  check_batch(tokens, targets, B, T);
  upload_params();
  upload_batch(tokens, targets, B * T, /*backward=*/true);
  run_forward(B, T);
  classifier(d_lnf_, B * T, grad_scale);
  run_backward(B, T);  // queued before the host waits for the losses
  if (!grads_on_device_) {
    device::copy(host_grads_.data(), dgrads_, host_grads_.size() * sizeof(float),
                 device::CopyKind::device_to_host, stream_);
    stream_.synchronize();
  }
  if (scored != nullptr)
    *scored = std::count_if(targets, targets + B * T, [](int32_t t) { return t >= 0; });
  grads_ready_from(0);
  return summed_loss(B * T);
}

void DeviceDecoder::run_backward(int64_t B, int64_t T) {
  const int64_t N = B * T;
  const float* P = dparams_;
  float* G = dgrads_;
  auto mut = [](const float* p) { return const_cast<float*>(p); };
  auto zero = [&](float* p, int64_t n) {
    device::zero(p, static_cast<size_t>(n) * sizeof(float), stream_);
  };
  zero(d_res_, N * C_);
  norm_backward(d_res_, mut(param("model.norm.weight", G)), mut(param("model.norm.bias", G)),
                d_lnf_, x_[L_], param("model.norm.weight", P), lnf_mean_, lnf_rstd_, N);
  for (int64_t l = L_ - 1; l >= 0; --l) {
    const Layer& p = param_layers_[static_cast<size_t>(l)];
    const Layer& g = grad_layers_[static_cast<size_t>(l)];
    const Acts& a = acts_by_layer_[static_cast<size_t>(l)];
    // x[l+1] = mid + down(act(up(norm2(mid))))
    if (gelu_in_epilogue(config_)) {
      linear_backward(d_fch_, mut(g.down_w), mut(g.down_b), d_res_, a.fca, p.down_w, N, F_, C_,
                      a.fch);
    } else {
      linear_backward(d_fca_, mut(g.down_w), mut(g.down_b), d_res_, a.fca, p.down_w, N, F_, C_);
      zero(d_fch_, N * F2_);
      if (config_.mlp == Mlp::swiglu)
        dev::swiglu_backward(stream_, d_fch_, d_fca_, a.fch, N, F_);
      else
        dev::gelu_backward(stream_, d_fch_, a.fch, d_fca_, N * F_);
    }
    linear_backward(d_ln_, mut(g.up_w), mut(g.up_b), d_fch_, a.ln2, p.up_w, N, C_, F2_);
    norm_backward(d_res_, mut(g.ln2_w), mut(g.ln2_b), d_ln_, a.mid, p.ln2_w, a.ln2_mean, a.ln2_rstd,
                  N);
    // mid = x[l] + o(attention(rope(qkv(norm1(x[l])))))
    linear_backward(d_att_, mut(g.o_w), mut(g.o_b), d_res_, a.att, p.o_w, N, Hq_ * D_, C_);
    attention_backward(a, d_att_, d_qkv_, B, T);
    if (config_.position == Position::rope) rope(d_qkv_, N, T, true);
    linear_backward(d_ln_, mut(g.qkv_w), mut(g.qkv_b), d_qkv_, a.ln1, p.qkv_w, N, C_, Q_);
    norm_backward(d_res_, mut(g.ln1_w), mut(g.ln1_b), d_ln_, x_[l], p.ln1_w, a.ln1_mean, a.ln1_rstd,
                  N);
    // With the gradients on the device, layer l's and those after it are
    // queued: a data-parallel run starts reducing them (on another stream).
    if (grads_on_device_) grads_ready_from(registry_.layer_begin(l));
  }
  dev::embedding_backward(stream_, mut(param("model.embed_tokens.weight", G)),
                          mut(param("model.embed_positions.weight", G)), d_res_, tokens_, B, T, C_,
                          groups_, token_groups_.count);
}

void DeviceDecoder::start_decode(int64_t max_len) {
  if (training_ || mixed())
    throw InputError("decoding: expected a device decoder built for inference in fp32");
  if (max_len < 1 || max_len > config_.seq_len) {
    throw InputError("decode length " + std::to_string(max_len) + " exceeds the config's seq_len " +
                     std::to_string(config_.seq_len));
  }
  const auto rows = static_cast<size_t>(max_len * Hkv_ * D_) * sizeof(float);
  device::ArenaPlan plan;
  for (int64_t l = 0; l < 2 * L_; ++l) plan.add(rows);
  plan.add(static_cast<size_t>(Hq_ * max_len) * sizeof(float));
  plan.add(static_cast<size_t>(Hq_) * sizeof(float));
  cache_ = device::DeviceArena(stream_.kind(), "kv cache", plan);
  kcache_.clear();
  vcache_.clear();
  for (int64_t l = 0; l < L_; ++l) {
    kcache_.push_back(cache_.take<float>(max_len * Hkv_ * D_));
    vcache_.push_back(cache_.take<float>(max_len * Hkv_ * D_));
  }
  decode_scores_ = cache_.take<float>(Hq_ * max_len);
  decode_lse_ = cache_.take<float>(Hq_);
  cache_len_ = max_len;
}

void DeviceDecoder::decode_step(int32_t token, int64_t pos, float* logits) {
  if (pos < 0 || pos >= cache_len_) {
    throw InputError("decode position " + std::to_string(pos) + " is past the KV cache (" +
                     std::to_string(cache_len_) + " positions)");
  }
  if (token < 0 || token >= V_) {
    throw InputError("token " + std::to_string(token) + " is outside the vocabulary [0, " +
                     std::to_string(V_) + ")");
  }
  upload_params();
  device::copy(tokens_, &token, sizeof token, device::CopyKind::host_to_device, stream_);
  const float* P = dparams_;
  const float* wpe = param("model.embed_positions.weight", P);
  float* x = x_[0];
  dev::embedding_forward(stream_, x, tokens_, param("model.embed_tokens.weight", P),
                         wpe == nullptr ? nullptr : wpe + pos * C_, 1, 1, C_);
  const auto theta = static_cast<float>(config_.rope_theta);
  const int64_t kv = Hkv_ * D_, group = Hq_ / Hkv_, n = pos + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D_));
  const Acts& a = acts_by_layer_[0];  // one row: the first layer's activations serve every layer
  for (int64_t l = 0; l < L_; ++l) {
    const Layer& p = param_layers_[static_cast<size_t>(l)];
    float* keys = kcache_[static_cast<size_t>(l)];
    float* values = vcache_[static_cast<size_t>(l)];
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, 1);
    linear_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, 1, C_, Q_);
    if (config_.position == Position::rope) {
      dev::rope(stream_, a.qkv, 1, 1, pos, Hq_, D_, rotary_, Q_, theta, false);
      dev::rope(stream_, a.qkv + Hq_ * D_, 1, 1, pos, Hkv_, D_, rotary_, Q_, theta, false);
    }
    const auto row_bytes = static_cast<size_t>(kv) * sizeof(float);
    device::copy(keys + pos * kv, a.qkv + Hq_ * D_, row_bytes, device::CopyKind::device_to_device,
                 stream_);
    device::copy(values + pos * kv, a.qkv + Hq_ * D_ + kv, row_bytes,
                 device::CopyKind::device_to_device, stream_);
    // Key/value head g's `group` query heads ([group, D], rows D apart)
    // against its n cached keys (rows kv apart): one GEMM per g, batched.
    gemm(false, true, group, n, D_, a.qkv, D_, keys, kv, 0.0f, decode_scores_, n, gemm_type_,
         {Hkv_, group * D_, D_, group * n});
    dev::causal_softmax_forward(stream_, decode_scores_, decode_lse_, Hq_, n, scale,
                                /*queries=*/1);
    gemm(false, false, group, D_, n, decode_scores_, n, values, kv, 0.0f, a.att, D_, gemm_type_,
         {Hkv_, group * n, D_, group * D_});
    linear_forward(a.mid, a.att, p.o_w, p.o_b, 1, Hq_ * D_, C_);
    dev::residual_forward(stream_, a.mid, a.mid, x, C_);
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, p.ln2_w, p.ln2_b, 1);
    mlp_up(p, a, 1);
    linear_forward(x, a.fca, p.down_w, p.down_b, 1, F_, C_);
    dev::residual_forward(stream_, x, x, a.mid, C_);
  }
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x, param("model.norm.weight", P),
               param("model.norm.bias", P), 1);
  const char* head = config_.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  gemm(false, true, 1, V_, C_, lnf_, C_, param(head, P), C_, 0.0f, logits_, V_, gemm_type_);
  device::copy(logits, logits_, static_cast<size_t>(V_) * sizeof(float),
               device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
}

}  // namespace anvil::model
