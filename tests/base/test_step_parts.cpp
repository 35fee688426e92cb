#include "anvil/base/step_parts.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <thread>

namespace anvil {
namespace {

void busy(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(StepParts, CountOnlyOnTheOpeningThreadOutsideOtherPartsAndParallelRegions) {
  start_step_parts();
  {
    const StepPartScope experts(StepPart::experts);
    busy(0.02);
    const StepPartScope gemm(StepPart::gemm);  // inside experts: counted there, not here
    busy(0.02);
  }
  {
    const StepPartScope attention(StepPart::attention);
    busy(0.01);
  }
#pragma omp parallel num_threads(2)
  {
    const StepPartScope gemm(StepPart::gemm);  // a region's own work is its caller's part
    busy(0.01);
  }
  std::thread other([] {
    const StepPartScope gemm(StepPart::gemm);  // not the recording thread
    busy(0.01);
  });
  other.join();
  const StepPartSeconds s = take_step_parts();
  EXPECT_GE(s[static_cast<size_t>(StepPart::experts)], 0.04);
  EXPECT_GE(s[static_cast<size_t>(StepPart::attention)], 0.01);
  EXPECT_EQ(s[static_cast<size_t>(StepPart::gemm)], 0.0);
  // After take, nothing records until the next start.
  {
    const StepPartScope gemm(StepPart::gemm);
    busy(0.005);
  }
  start_step_parts();
  EXPECT_EQ(take_step_parts()[static_cast<size_t>(StepPart::gemm)], 0.0);
  EXPECT_STREQ(step_part_name(StepPart::experts), "experts");
}

}  // namespace
}  // namespace anvil
