// `anvil hw`: what this machine is (CPU, ISA, caches, memory, the BLAS and
// its kernels, oneDNN, MPI) and, with --profile, a measured hardware profile.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "anvil/plan/hw_profile.hpp"

namespace anvil::bench {

nlohmann::json hw_report();
std::string hw_report_text(const nlohmann::json& report);

struct ProfileOptions {
  double min_seconds = 0.1;  // per measurement
  bool progress = false;
};

// Measures GEMM peaks and efficiency curves (f32, bf16; 1..N threads) and
// memory bandwidth per level, and returns them as a profile named "local".
plan::HwProfile measure_local_profile(const ProfileOptions& options);

}  // namespace anvil::bench
