// Fused attention where this build has no cuDNN frontend (or no CUDA): it
// says why, and the decoder keeps its unfused attention.
#include "anvil/base/error.hpp"
#include "anvil/device/fused_attention.hpp"

namespace anvil::device {

struct FusedAttention::Graphs {};

std::string fused_attention_unavailable() {
  const std::string why = cuda_unavailable_reason();  // a build without CUDA says so
  if (!why.empty()) return why;
  return "this anvil was built without the cuDNN frontend's headers (scripts/install-deps.sh "
         "fetches them into .deps/)";
}

FusedAttention::FusedAttention(const AttentionShape&, Stream&) {
  throw SystemError("fused attention: " + fused_attention_unavailable());
}
FusedAttention::~FusedAttention() = default;
void FusedAttention::forward(const bf16*, bf16*, float*) {}
void FusedAttention::backward(const bf16*, const bf16*, const bf16*, const float*, bf16*) {}
size_t FusedAttention::workspace_bytes() const {
  return 0;
}

}  // namespace anvil::device
