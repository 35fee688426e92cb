// ZAYA1's experts: SwiGLU MLPs (fc1 -> gate | up halves, fc2) run as grouped
// GEMMs over rows that arrive sorted by expert, one contiguous segment per
// expert, so no token is dropped or padded; with several threads, each
// expert whole on one thread (single-threaded GEMMs). The token dispatcher
// (zaya_dispatcher.hpp) decides where those rows live — the layer's own
// sorted rows, or the rows other ranks sent under expert parallelism — and
// hands them over with room for the outputs and what backward needs.
#pragma once

#include <cstdint>

#include "anvil/kernels/layers.hpp"
#include "anvil/model/zaya_moe_shape.hpp"

namespace anvil::model {

// The rows the experts of this process run on: expert j (of `experts`;
// its weights the j-th of the layer's fc1 / fc2 blocks) owns rows
// [offsets[j], offsets[j + 1]).
struct ExpertRows {
  int64_t experts = 0;
  const int64_t* offsets = nullptr;      // [experts + 1], offsets[0] = 0
  const float* x = nullptr;              // [rows, H] in
  float* y = nullptr;                    // [rows, H] the experts' outputs
  float* fc1 = nullptr;                  // [rows, 2F] kept for backward
  float* act = nullptr;                  // [rows, F] kept for backward
  kernels::Bf16Scratch* bf16 = nullptr;  // bf16 GEMMs: rows x max(2F, H) elements each
  int64_t rows() const { return offsets[experts]; }
};

// Their backward: dy in, dx out (written, every row), and the experts'
// scratch.
struct ExpertGrads {
  const float* dy = nullptr;  // [rows, H]
  float* dx = nullptr;        // [rows, H]
  float* dfc1 = nullptr;      // [rows, 2F]
  float* dact = nullptr;      // [rows, F]
};

// With `low` (bf16) the GEMMs multiply bf16 copies of the weights and of
// their inputs through rows.bf16; fp32 accumulation either way.
void experts_forward(const ExpertRows& rows, const ZayaMoeShape& s, const ZayaExpertParams& p,
                     const kernels::Bf16Weights* low = nullptr);
// Writes d/dx into d.dx and every expert's weight gradients into g (over
// what they held: zeros for an expert without rows).
void experts_backward(const ExpertGrads& d, const ExpertRows& rows, const ZayaMoeShape& s,
                      const ZayaExpertParams& g, const ZayaExpertParams& p,
                      const kernels::Bf16Weights* low = nullptr);
// Elements of the bf16 conversion scratch the experts need for `rows` rows.
int64_t experts_bf16_scratch(const ZayaMoeShape& s, int64_t rows);

}  // namespace anvil::model
