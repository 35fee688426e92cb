// ZAYA1's SwiGLU experts as one GEMM pair per expert segment.
#include "anvil/model/zaya_experts.hpp"

#include <algorithm>

#include "anvil/kernels/layers.hpp"

namespace anvil::model {
namespace {

// Expert segments change their row counts every step: fp32 runs on OpenBLAS;
// bf16 on oneDNN with the row count left to run time, one primitive per
// weight shape (where bf16 is emulated: widened for OpenBLAS's sgemm).
constexpr auto kSegmentGemm = device::GemmBackend::segments;

}  // namespace

int64_t experts_bf16_scratch(const ZayaMoeShape& s, int64_t rows) {
  return rows * std::max(2 * s.expert_ffn, s.hidden);
}

void experts_forward(const ExpertRows& r, const ZayaMoeShape& s, const ZayaExpertParams& p,
                     const kernels::Bf16Weights* low) {
  const int64_t H = s.hidden, F = s.expert_ffn;
  for (int64_t e = 0; e < r.experts; ++e) {
    const int64_t b = r.offsets[e], n = r.offsets[e + 1] - b;
    if (n == 0) continue;
    kernels::linear_forward(r.fc1 + b * 2 * F, r.x + b * H,
                            kernels::matmul_weight(low, p.fc1 + e * 2 * F * H), nullptr, n, H,
                            2 * F, r.bf16, kSegmentGemm);
    kernels::swiglu_forward(r.act + b * F, r.fc1 + b * 2 * F, n, F);
    kernels::linear_forward(r.y + b * H, r.act + b * F,
                            kernels::matmul_weight(low, p.fc2 + e * H * F), nullptr, n, F, H,
                            r.bf16, kSegmentGemm);
  }
}

void experts_backward(const ExpertGrads& d, const ExpertRows& r, const ZayaMoeShape& s,
                      const ZayaExpertParams& g, const ZayaExpertParams& p,
                      const kernels::Bf16Weights* low) {
  const int64_t H = s.hidden, F = s.expert_ffn, rows = r.rows();
  kernels::zero(d.dact, rows * F);
  kernels::zero(d.dfc1, rows * 2 * F);
  for (int64_t e = 0; e < r.experts; ++e) {
    const int64_t b = r.offsets[e], n = r.offsets[e + 1] - b;
    if (n == 0) continue;
    kernels::linear_backward(d.dact + b * F, g.fc2 + e * H * F, nullptr, d.dy + b * H,
                             r.act + b * F, kernels::matmul_weight(low, p.fc2 + e * H * F), n, F, H,
                             r.bf16, kSegmentGemm);
    kernels::swiglu_backward(d.dfc1 + b * 2 * F, d.dact + b * F, r.fc1 + b * 2 * F, n, F);
    kernels::linear_backward(d.dx + b * H, g.fc1 + e * 2 * F * H, nullptr, d.dfc1 + b * 2 * F,
                             r.x + b * H, kernels::matmul_weight(low, p.fc1 + e * 2 * F * H), n, H,
                             2 * F, r.bf16, kSegmentGemm);
  }
}

}  // namespace anvil::model
