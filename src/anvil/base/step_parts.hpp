// Where a training step's wall time goes: the seconds spent in its GEMMs,
// attention kernels and MoE experts, as `anvil train` reports them per step
// (metrics.jsonl "parts", the summary line) and as bench/plan_validation.sh
// compares them with the planner's terms.
//
// The trainer's thread opens a step (start_step_parts), the layers wrap
// their work in StepPartScope, and take_step_parts hands the sums back. A
// scope counts only on the thread that opened the step, outside OpenMP
// parallel regions, and only when no other scope is open there: the GEMMs
// an expert runs belong to "experts", not to "gemm". Everything else a step
// does (norms, activations, losses, dispatch, zeroing) is its remainder.
// Two clock reads per scope: a few hundred per step, far below a
// microsecond's cost against steps of milliseconds.
#pragma once

#include <array>
#include <cstddef>

namespace anvil {

enum class StepPart { gemm, attention, experts };
inline constexpr std::size_t kStepParts = 3;
// "gemm", "attention", "experts": the names records and tables use.
const char* step_part_name(StepPart p);

using StepPartSeconds = std::array<double, kStepParts>;

// Zeroes the sums and makes the calling thread the one that records.
void start_step_parts();
// The sums since start_step_parts; the thread stops recording.
StepPartSeconds take_step_parts();

class StepPartScope {
 public:
  explicit StepPartScope(StepPart part);
  ~StepPartScope();
  StepPartScope(const StepPartScope&) = delete;
  StepPartScope& operator=(const StepPartScope&) = delete;

 private:
  StepPart part_;
  double start_ = -1;  // < 0: not counting
};

}  // namespace anvil
