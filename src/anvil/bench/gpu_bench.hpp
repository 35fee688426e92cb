// The microbenchmarks on a CUDA GPU, through the device seam only (no vendor
// header here): `bench gemm --device cuda` (cuBLASLt, with the best of its
// top heuristic algorithms timed beside its default choice), `bench membw
// --device cuda` (STREAM kernels from L2-resident to HBM-sized working sets),
// `bench comm --device cuda` (NCCL, nccl-tests' columns and exact check),
// `anvil hw` on a GPU and `hw --profile` there (a measured GPU profile).
// Percentages of the datasheet come from the published profile that ships
// for the GPU model (profiles/h100-sxm.json, h200-sxm.json), with its sources.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "anvil/bench/comm_bench.hpp"
#include "anvil/bench/gemm_bench.hpp"
#include "anvil/bench/hw_report.hpp"
#include "anvil/bench/membw_bench.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/plan/hw_profile.hpp"

namespace anvil::bench {

// The published profile of this GPU's model; nullopt when none ships.
std::optional<plan::HwProfile> gpu_datasheet(const device::GpuProperties& gpu);

GemmBenchResult run_gemm_bench_gpu(const GemmBenchOptions& options);
MembwResult run_membw_bench_gpu(const MembwOptions& options);

// The NCCL sweep on one GPU per rank. `broadcast_id` gives rank 0's NCCL id
// to all ranks; `max_over_ranks` is the slowest rank's value of a time (both
// identity on one rank, where no MPI is needed).
struct GpuCommRuntime {
  int rank = 0, world = 1;
  std::function<void(void*, size_t)> broadcast_id = [](void*, size_t) {};
  std::function<double(double)> max_over_ranks = [](double t) { return t; };
};
CommBenchResult run_comm_bench_gpu(const CommBenchOptions& options, const GpuCommRuntime& rt);

// `anvil hw`'s "gpus" section: one entry per GPU, or {"available": false,
// "reason": ...} where none can be used.
nlohmann::json gpu_report();
std::string gpu_report_text(const nlohmann::json& gpus);

// A measured profile of GPU 0: the GEMM grid (bf16, fp32, tf32; the same
// grid as the CPU's), HBM bandwidth per working set, and the one-GPU NCCL
// fits are left to `bench comm --device cuda --profile`.
plan::HwProfile measure_gpu_profile(const ProfileOptions& options);

}  // namespace anvil::bench
