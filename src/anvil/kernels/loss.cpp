// The classifier and the softmax cross-entropy fused, chunked over rows: the
// [rows, V] logits exist for one chunk at a time and turn into their own
// gradient in place, so a 50k vocabulary costs chunk*V floats, not N*V.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "anvil/device/gemm.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/kernels/fast_math.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::kernels {

double classifier_loss(float* dx, float* dweight, const float* x, MatmulWeight weight,
                       const int32_t* targets, int64_t N, int64_t C, int64_t V, float* scratch,
                       int64_t chunk, int64_t* scored, float grad_scale, Bf16Scratch* low) {
  const bool mixed = weight.bf16_copy != nullptr;
  // bf16: the weight gradient of kClassifierWgradChunks chunks in one GEMM
  // (their bf16 x and dlogits side by side in the scratch): V x C x 256 rows
  // at a time ran at ~0.6 of the bf16 peak, the same over 1,024 rows at ~0.9.
  const int64_t group = classifier_wgrad_rows(chunk, N);
  if (mixed && (low == nullptr || low->capacity < group * std::max(C, V))) {
    throw std::logic_error("classifier_loss: bf16 scratch too small");
  }
  // Token files are checked against their vocabulary when opened; this keeps
  // logits[target] in bounds whatever the caller passes (negative: not scored).
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= V) {
      throw std::out_of_range("classifier_loss: target " + std::to_string(targets[i]) +
                              " at position " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
  }
  double total = 0.0;
  int64_t count = 0;
  std::vector<double> row_loss(static_cast<size_t>(chunk));
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    const int64_t g0 = r0 / group * group;  // this chunk's group: rows [g0, g0 + group)
    bf16* xa = mixed ? low->a + (r0 - g0) * C : nullptr;
    bf16* db = mixed ? low->b + (r0 - g0) * V : nullptr;
    if (mixed) {
      convert_to_bf16(xa, x + r0 * C, rows * C);
      device::gemm(false, true, rows, V, C, 1.0f, xa, C, weight.bf16_copy, C, 0.0f, scratch, V);
    } else {
      device::gemm(false, true, rows, V, C, 1.0f, x + r0 * C, C, weight.f32, C, 0.0f, scratch, V);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* logits = scratch + r * V;
      const int32_t target = targets[r0 + r];
      const float maxv = max_of(logits + 1, V - 1, logits[0]);
      const float target_logit = target >= 0 ? logits[target] - maxv : 0.0f;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        logits[j] = fast_exp(logits[j] - maxv);
        sum += logits[j];
      }
      if (target < 0) {
        row_loss[r] = 0.0;
        if (dx != nullptr) {
          for (int64_t j = 0; j < V; ++j) logits[j] = 0.0f;
        }
        continue;
      }
      row_loss[r] = std::log(static_cast<double>(sum)) - target_logit;
      if (dx != nullptr) {
        const float inv = grad_scale / sum;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) logits[j] = body::cross_entropy_dlogit(logits[j], inv);
        logits[target] = body::cross_entropy_target(logits[target], grad_scale);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r0 + r] < 0) continue;
      total += row_loss[r];
      ++count;
    }
    if (dx != nullptr && mixed) {
      convert_to_bf16(db, scratch, rows * V);
      device::gemm(false, false, rows, C, V, 1.0f, db, V, weight.bf16_copy, C, 1.0f, dx + r0 * C,
                   C);
      const int64_t done = r0 + rows - g0;  // rows of the group so far
      if (done == group || r0 + rows == N)
        device::gemm(true, false, V, C, done, 1.0f, low->b, V, low->a, C, 1.0f, dweight, C);
    } else if (dx != nullptr) {
      device::gemm(false, false, rows, C, V, 1.0f, scratch, V, weight.f32, C, 1.0f, dx + r0 * C, C);
      device::gemm(true, false, V, C, rows, 1.0f, scratch, V, x + r0 * C, C, 1.0f, dweight, C);
    }
  }
  if (scored != nullptr) *scored = count;
  return total;
}

}  // namespace anvil::kernels
