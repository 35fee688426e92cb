// gpu_layers.hpp in a build without CUDA: every call throws the reason.
#include "anvil/base/error.hpp"
#include "anvil/kernels/gpu_layers.hpp"

namespace anvil::kernels::gpu {
namespace {

[[noreturn]] void absent() {
  throw SystemError(
      "GPU layers: this anvil was built without CUDA (ANVIL_CUDA=off, or no nvcc at build time)");
}

}  // namespace

void embedding_forward(float*, const int32_t*, const float*, const float*, int64_t, int64_t,
                       int64_t, void*) {
  absent();
}
void convert_to_bf16(uint16_t*, const float*, int64_t, void*) {
  absent();
}
void convert_from_bf16(float*, const uint16_t*, int64_t, void*) {
  absent();
}
void embedding_backward(float*, float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                        int64_t, void*) {
  absent();
}
void bias_backward(float*, const float*, int64_t, int64_t, float*, void*) {
  absent();
}
void causal_softmax_forward(float*, float*, int64_t, int64_t, int64_t, float, void*) {
  absent();
}
void causal_softmax_backward(float*, const float*, int64_t, int64_t, float, void*) {
  absent();
}
void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t,
                       int64_t, float, void*) {
  absent();
}
void layernorm_backward(float*, float*, float*, const float*, const float*, const float*,
                        const float*, const float*, int64_t, int64_t, float*, void*) {
  absent();
}
void rmsnorm_forward(float*, float*, const float*, const float*, int64_t, int64_t, float, void*) {
  absent();
}
void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*,
                      int64_t, int64_t, float*, void*) {
  absent();
}
void gelu_forward(float*, const float*, int64_t, void*) {
  absent();
}
void gelu_backward(float*, const float*, const float*, int64_t, void*) {
  absent();
}
void swiglu_forward(float*, const float*, int64_t, int64_t, void*) {
  absent();
}
void swiglu_backward(float*, const float*, const float*, int64_t, int64_t, void*) {
  absent();
}
void residual_forward(float*, const float*, const float*, int64_t, void*) {
  absent();
}
void rope_apply(float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float,
                void*) {
  absent();
}
void cross_entropy(float*, float*, const int32_t*, int64_t, int64_t, float, void*) {
  absent();
}
void adamw_update(float*, float*, float*, const float*, int64_t, const body::AdamWStep&, float,
                  void*) {
  absent();
}
void adamw_pieces(float*, float*, float*, const float*, const body::AdamWPiece*, int64_t, int64_t,
                  float, void*) {
  absent();
}
void muon_momentum(float*, float*, const float*, int64_t, float, bool, float, void*) {
  absent();
}
void muon_apply(float*, const float*, int64_t, float, float, void*) {
  absent();
}
void scale(float*, const float*, int64_t, float, void*) {
  absent();
}
void scale_to_unit_norm(float*, const float*, int64_t, double*, float*, void*) {
  absent();
}
void max_abs_bits(const float*, int64_t, uint32_t*, void*) {
  absent();
}
void fixed_square_sum(const float*, int64_t, double, unsigned long long*, void*) {
  absent();
}

}  // namespace anvil::kernels::gpu
