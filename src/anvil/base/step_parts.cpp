#include "anvil/base/step_parts.hpp"

#include <omp.h>

#include <array>

#include "anvil/base/clock.hpp"

namespace anvil {
namespace {

// Per thread: only the trainer's thread ever records, so the sums need no
// synchronisation (background savers and communication threads keep
// `recording` false).
thread_local bool recording = false;
thread_local bool open_scope = false;
thread_local StepPartSeconds sums{};

}  // namespace

const char* step_part_name(StepPart p) {
  static constexpr std::array<const char*, kStepParts> kNames = {"gemm", "attention", "experts"};
  return kNames[static_cast<std::size_t>(p)];
}

void start_step_parts() {
  sums = {};
  open_scope = false;
  recording = true;
}

StepPartSeconds take_step_parts() {
  recording = false;
  return sums;
}

StepPartScope::StepPartScope(StepPart part) : part_(part) {
  if (!recording || open_scope || omp_in_parallel()) return;
  open_scope = true;
  start_ = now_seconds();
}

StepPartScope::~StepPartScope() {
  if (start_ < 0) return;
  sums[static_cast<std::size_t>(part_)] += now_seconds() - start_;
  open_scope = false;
}

}  // namespace anvil
