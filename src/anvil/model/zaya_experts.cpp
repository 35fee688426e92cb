// ZAYA1's SwiGLU experts as one GEMM pair per expert segment.
#include "anvil/model/zaya_experts.hpp"

#include <omp.h>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "anvil/base/threads.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::model {
namespace {

// Expert segments change their row counts every step: fp32 runs on OpenBLAS;
// bf16 on oneDNN with the row count left to run time, one primitive per
// weight shape (where bf16 is emulated: widened for OpenBLAS's sgemm).
constexpr auto kSegmentGemm = device::GemmBackend::segments;

bool experts_per_thread() {
  static const bool on = [] {
    const char* v = std::getenv("ANVIL_EXPERTS");
    return !(v && std::string(v) == "shared");
  }();
  return on;
}

// Runs body(e, scratch) for every expert with rows. Several experts: one per
// thread at a time, largest segment first, each on single-threaded GEMMs
// and kernels (a segment of ~100-200 rows keeps one core busier than two
// share it: no fork, join or split packing per GEMM). Each expert writes
// its own rows and its own weights' gradients, and its arithmetic does not
// depend on the thread it runs on, so the result is the same either way.
// The bf16 scratch is cut by rows: expert e converts into its rows' part.
template <typename Body>
void for_each_expert(const ExpertRows& r, const ZayaMoeShape& shape, const Body& body) {
  const int64_t scratch_row = experts_bf16_scratch(shape, 1);
  std::vector<int64_t> order;
  for (int64_t e = 0; e < r.experts; ++e)
    if (r.offsets[e + 1] > r.offsets[e]) order.push_back(e);
  auto rows = [&](int64_t e) { return r.offsets[e + 1] - r.offsets[e]; };
  auto scratch = [&](int64_t e) {
    kernels::Bf16Scratch s{};
    if (r.bf16) {
      const int64_t at = r.offsets[e] * scratch_row;
      s = {r.bf16->a + at, r.bf16->b + at, rows(e) * scratch_row};
    }
    return s;
  };
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || order.size() < 2 || !experts_per_thread()) {
    for (int64_t e : order) {
      kernels::Bf16Scratch s = scratch(e);
      body(e, r.bf16 ? &s : nullptr);
    }
    return;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows(a) > rows(b); });
  for_each_single_threaded(static_cast<int64_t>(order.size()), threads, [&](int64_t k, int) {
    const int64_t e = order[static_cast<size_t>(k)];
    kernels::Bf16Scratch s = scratch(e);
    body(e, r.bf16 ? &s : nullptr);
  });
}

}  // namespace

int64_t experts_bf16_scratch(const ZayaMoeShape& s, int64_t rows) {
  return rows * std::max(2 * s.expert_ffn, s.hidden);
}

void experts_forward(const ExpertRows& r, const ZayaMoeShape& s, const ZayaExpertParams& p,
                     const kernels::Bf16Weights* low) {
  const int64_t H = s.hidden, F = s.expert_ffn;
  for_each_expert(r, s, [&](int64_t e, kernels::Bf16Scratch* bf16) {
    const int64_t b = r.offsets[e], n = r.offsets[e + 1] - b;
    kernels::linear_forward(r.fc1 + b * 2 * F, r.x + b * H,
                            kernels::matmul_weight(low, p.fc1 + e * 2 * F * H), nullptr, n, H,
                            2 * F, bf16, kSegmentGemm);
    kernels::swiglu_forward(r.act + b * F, r.fc1 + b * 2 * F, n, F);
    kernels::linear_forward(r.y + b * H, r.act + b * F,
                            kernels::matmul_weight(low, p.fc2 + e * H * F), nullptr, n, F, H, bf16,
                            kSegmentGemm);
  });
}

void experts_backward(const ExpertGrads& d, const ExpertRows& r, const ZayaMoeShape& s,
                      const ZayaExpertParams& g, const ZayaExpertParams& p,
                      const kernels::Bf16Weights* low) {
  const int64_t H = s.hidden, F = s.expert_ffn;
  // Every gradient here is written, not added: an expert's rows and weights
  // are its own, so nothing is zeroed first (and no GEMM reads old values).
  // An expert without rows has zero weight gradients.
  for (int64_t e = 0; e < r.experts; ++e) {
    if (r.offsets[e + 1] > r.offsets[e]) continue;
    kernels::zero(g.fc1 + e * 2 * F * H, 2 * F * H);
    kernels::zero(g.fc2 + e * H * F, H * F);
  }
  constexpr auto kWrite = kernels::GradStore::write;
  for_each_expert(r, s, [&](int64_t e, kernels::Bf16Scratch* bf16) {
    const int64_t b = r.offsets[e], n = r.offsets[e + 1] - b;
    kernels::linear_backward(d.dact + b * F, g.fc2 + e * H * F, nullptr, d.dy + b * H,
                             r.act + b * F, kernels::matmul_weight(low, p.fc2 + e * H * F), n, F, H,
                             bf16, kSegmentGemm, kWrite);
    kernels::swiglu_backward(d.dfc1 + b * 2 * F, d.dact + b * F, r.fc1 + b * 2 * F, n, F, kWrite);
    kernels::linear_backward(d.dx + b * H, g.fc1 + e * 2 * F * H, nullptr, d.dfc1 + b * 2 * F,
                             r.x + b * H, kernels::matmul_weight(low, p.fc1 + e * 2 * F * H), n, H,
                             2 * F, bf16, kSegmentGemm, kWrite);
  });
}

}  // namespace anvil::model
