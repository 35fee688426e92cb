// FusedAttention on cuDNN's SDPA (flash attention) through the cuDNN
// frontend's graph API. cuDNN is loaded when first used (dlopen
// libcudnn.so.9: the frontend's dynamic loading), so a binary starts where it
// is missing and only the fused path says so; the decoder then keeps its
// unfused attention. One forward and one backward graph per shape: the
// tensors are described by attention_layout's strides, so the decoder's qkv,
// out and lse buffers are read and written in place.
#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/device/cuda_check.hpp"
#include "anvil/device/dynamic_library.hpp"
#include "anvil/device/fused_attention.hpp"

// The frontend's dynamic loading reads cuDNN's symbols from this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace anvil::device {
namespace {

namespace fe = cudnn_frontend;

// Empty once cuDNN is loaded; else why not. The frontend makes its own CUDA
// runtime calls through a shared libcudart it opens by name (anvil links
// the runtime statically), trying CUDA 12's before 13's: it is pointed at
// the major version anvil was built with unless CUDNN_FRONTEND_CUDART_LIB_NAME
// names one, and that library must open here, or every graph build fails.
const std::string& cudnn_error() {
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    ::setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), /*overwrite=*/0);
    const char* name = std::getenv("CUDNN_FRONTEND_CUDART_LIB_NAME");
    std::string why;
    if (open_library(name, why) == nullptr) {
      error = std::string(name) + " (the cuDNN frontend's CUDA runtime): " + why;
      return;
    }
    void* lib = open_library("libcudnn.so.9", error);
    if (lib) fe::cudnn_dlhandle = lib;
  });
  return error;
}

void check(fe::error_t e, const char* what) {
  if (e.is_bad())
    throw SystemError(std::string("cuDNN fused attention: ") + what + ": " + e.get_message());
}

void check_status(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw SystemError(std::string("cuDNN fused attention: ") + what + " failed (status " +
                      std::to_string(static_cast<int>(status)) + ")");
}

enum Uid : int64_t { kQ = 1, kK, kV, kOut, kStats, kDout, kDq, kDk, kDv };

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) {
  return {a.begin(), a.end()};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    const AttentionTensor& t, int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim(vec(t.dims))
                      .set_stride(vec(t.strides))
                      .set_uid(uid));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, const AttentionTensor& l,
            int64_t uid) {
  t->set_output(true).set_dim(vec(l.dims)).set_stride(vec(l.strides)).set_uid(uid);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

void build(fe::graph::Graph& g, cudnnHandle_t handle) {
  check(g.validate(), "validate");
  check(g.build_operation_graph(handle), "build_operation_graph");
  check(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check(g.check_support(handle), "check_support");
  check(g.build_plans(handle), "build_plans");
}

}  // namespace

struct FusedAttention::Graphs {
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> forward, backward;
  AttentionLayout layout;
  DeviceBuffer workspace;
  ~Graphs() {  // the plans before the handle they were built on
    forward.reset();
    backward.reset();
    if (handle) fe::detail::destroy_handle(handle);
  }
};

std::string fused_attention_unavailable() {
  std::string why = cuda_unavailable_reason();
  if (!why.empty()) return why;
  if (!cudnn_error().empty()) return "cuDNN: " + cudnn_error();
  int ordinal = 0;
  if (cudaGetDevice(&ordinal) != cudaSuccess) return "no current GPU";
  const GpuProperties p = gpu_properties(ordinal);
  if (p.cc_major < 8)
    return "cuDNN's fused attention needs sm_80 or newer; GPU " + std::to_string(ordinal) +
           " is sm_" + std::to_string(p.cc_major) + std::to_string(p.cc_minor);
  return "";
}

// The frontend reports some failures (a library or symbol it cannot load)
// as plain std::runtime_error: they become SystemError like cuDNN's own, so
// the decoder falls back to the unfused attention for either.
FusedAttention::FusedAttention(const AttentionShape& shape, Stream& stream) try
    : graphs_(std::make_unique<Graphs>()) {
  require(DeviceKind::cuda, "fused attention");
  if (!cudnn_error().empty()) throw SystemError("fused attention: cuDNN: " + cudnn_error());
  Graphs& g = *graphs_;
  g.layout = attention_layout(shape);
  const AttentionLayout& l = g.layout;
  check_status(fe::detail::create_handle(&g.handle), "cudnnCreate");
  check_status(fe::detail::set_stream(g.handle, static_cast<cudaStream_t>(stream.native())),
               "cudnnSetStream");

  g.forward = new_graph();
  {
    fe::graph::Graph& f = *g.forward;
    auto q = input(f, "q", l.q, kQ), k = input(f, "k", l.k, kK), v = input(f, "v", l.v, kV);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(shape.scale);
    auto [out, stats] = f.sdpa(q, k, v, options);
    output(out, l.out, kOut);
    output(stats, l.stats, kStats);
    stats->set_data_type(fe::DataType_t::FLOAT);
    build(f, g.handle);
  }
  g.backward = new_graph();
  {
    fe::graph::Graph& b = *g.backward;
    auto q = input(b, "q", l.q, kQ), k = input(b, "k", l.k, kK), v = input(b, "v", l.v, kV);
    auto out = input(b, "out", l.out, kOut), dout = input(b, "dout", l.out, kDout);
    auto stats = b.tensor(fe::graph::Tensor_attributes()
                              .set_name("stats")
                              .set_dim(vec(l.stats.dims))
                              .set_stride(vec(l.stats.strides))
                              .set_uid(kStats)
                              .set_data_type(fe::DataType_t::FLOAT));
    // Deterministic: by default dQ is summed over key blocks in an fp32
    // buffer in whatever order the blocks finish, and a run would not
    // repeat its bits (nor resume onto them). On Hopper this takes the dP
    // workspace (fused_attention_workspace_bound).
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention backward")
                       .set_causal_mask(true)
                       .set_attn_scale(shape.scale)
                       .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = b.sdpa_backward(q, k, v, out, dout, stats, options);
    output(dq, l.q, kDq);
    output(dk, l.k, kDk);
    output(dv, l.v, kDv);
    build(b, g.handle);
  }
  int64_t forward_bytes = 0, backward_bytes = 0;
  check(g.forward->get_workspace_size(forward_bytes), "get_workspace_size");
  check(g.backward->get_workspace_size(backward_bytes), "get_workspace_size");
  const auto bytes = static_cast<size_t>(std::max<int64_t>({forward_bytes, backward_bytes, 1}));
  g.workspace = DeviceBuffer(DeviceKind::cuda, bytes, "cuDNN attention workspace");
} catch (const InputError&) {
  throw;
} catch (const SystemError&) {
  throw;
} catch (const std::exception& e) {
  throw SystemError(std::string("cuDNN fused attention: ") + e.what());
}

FusedAttention::~FusedAttention() = default;

size_t FusedAttention::workspace_bytes() const {
  return graphs_->workspace.bytes();
}

namespace {

// The uids of q, k and v (or dq, dk and dv from `first`) at their places in a
// qkv-shaped buffer.
void add_qkv(std::unordered_map<int64_t, void*>& pack, const AttentionLayout& l, const bf16* base,
             int64_t first) {
  auto* b = const_cast<bf16*>(base);
  pack[first] = b + l.q.offset;
  pack[first + 1] = b + l.k.offset;
  pack[first + 2] = b + l.v.offset;
}

}  // namespace

void FusedAttention::forward(const bf16* qkv, bf16* out, float* stats) {
  Graphs& g = *graphs_;
  const AttentionLayout& l = g.layout;
  std::unordered_map<int64_t, void*> pack = {{kOut, out + l.out.offset},
                                             {kStats, stats + l.stats.offset}};
  add_qkv(pack, l, qkv, kQ);
  check(g.forward->execute(g.handle, pack, g.workspace.data()), "forward");
}

void FusedAttention::backward(const bf16* qkv, const bf16* out, const bf16* dout,
                              const float* stats, bf16* dqkv) {
  Graphs& g = *graphs_;
  const AttentionLayout& l = g.layout;
  std::unordered_map<int64_t, void*> pack = {{kOut, const_cast<bf16*>(out) + l.out.offset},
                                             {kDout, const_cast<bf16*>(dout) + l.out.offset},
                                             {kStats, const_cast<float*>(stats) + l.stats.offset}};
  add_qkv(pack, l, qkv, kQ);
  add_qkv(pack, l, dqkv, kDq);
  check(g.backward->execute(g.handle, pack, g.workspace.data()), "backward");
}

}  // namespace anvil::device
