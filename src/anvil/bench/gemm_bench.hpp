// `anvil bench gemm`: GEMM throughput against shape ("kernel sizing"), dtype
// and thread count, with the baselines measured in the same run:
//   library  the raw OpenBLAS call with the library's own CPU detection
//            (a child process, since the core type is fixed at load time)
//   env      the raw OpenBLAS call with OPENBLAS_CORETYPE as inherited, when
//            the environment sets one that differs from anvil's choice
//   coretype:NAME  the raw OpenBLAS call with OPENBLAS_CORETYPE=NAME (child)
//   openblas the OpenBLAS sgemm in this process (anvil's core type): shows
//            what the automatic backend's shape rule gains
//   onednn   oneDNN's f32 matmul (another BLAS-class library on this machine)
//   naive    the reference triple loop, for small shapes only
// bf16 rows run the process's bf16 path (device::bf16_path()); where the CPU
// has AVX512_BF16, the other path is measured beside it ("bf16-native" or
// "bf16-emulated").
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/table.hpp"
#include "anvil/bench/measure.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/plan/hw_profile.hpp"

namespace anvil::bench {

struct GemmCase {
  std::string label;  // what the shape is: "square", "align 8", "attn.qkv.fwd"
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};

struct GemmBenchOptions {
  std::string preset = "square";  // square | aligned | model | grid
  std::vector<int64_t> sizes;     // square: the dims; aligned: the base dim(s); grid: each dim's values
  std::string config_path;        // model preset
  std::vector<std::string> overrides;
  int64_t tokens = 1024;          // model preset: tokens per GEMM (batch x seq)
  int64_t tokens_per_expert = 0;  // model preset: 0 = tokens * top_k / n_experts
  bool backward = false;          // model preset: add dgrad and wgrad GEMMs
  std::vector<std::string> dtypes = {"f32"};
  std::vector<int> threads;  // empty: all cores
  std::vector<std::string> baselines = {"library", "env", "openblas", "onednn", "naive"};
  double naive_max_flops = 2.0 * 256 * 256 * 256;
  TimingPolicy timing;
  // Sweep the cases this many times and pool each case's samples (CPU; the
  // baselines are timed on the last pass only): a slow spell of a shared
  // machine then lands on every shape alike instead of on a few.
  int passes = 1;
  bool progress = false;  // a live line on stderr
  device::DeviceKind device = device::DeviceKind::cpu;  // cuda: gpu_bench.hpp
  int algos = 8;  // cuda: cuBLASLt's top heuristic algorithms timed for the best-algo column
  // cuda: bf16 and fp16 write fp32 output (as training's GEMMs do), not their own type
  bool low_out_f32 = false;
};

struct GemmRow {
  GemmCase shape;
  std::string dtype;
  int threads = 1;
  double gflops = 0;       // from the median call time
  double gflops_best = 0;  // from the fastest call
  double pct_of_peak = 0;  // of the best median GFLOP/s in its (dtype, threads) group
  std::map<std::string, double> baseline_gflops;  // absent: not measured
  double pct_of_datasheet = std::numeric_limits<double>::quiet_NaN();  // GPUs: of the published peak
};

struct GemmSummary {
  std::string dtype;
  int threads = 1;
  double peak_gflops = 0;
  // Smallest per-GEMM work (FLOPs) from which every measured shape of the
  // group reaches 90% of peak; NaN when the sweep never gets there.
  double work_for_90pct_flops = 0;
  std::vector<std::pair<double, double>> efficiency_curve;  // (flops, fraction of peak)
};

// The grid preset: every (m, n, k) from these values in the three
// transpositions a layer runs (forward A B^T, dgrad A B, wgrad A^T B), up to
// kGridMaxFlops per GEMM: the efficiency surface anvil plan interpolates.
inline const std::vector<int64_t> kGridSizes = {64, 256, 1024, 4096};
inline constexpr double kGridMaxFlops = 3.5e10;

struct GemmBenchResult {
  std::string preset;  // the options' preset: grid rows go to a profile's gemm_grid
  std::vector<GemmRow> rows;
  std::vector<GemmSummary> summaries;
  std::map<std::string, std::string> baseline_notes;  // name -> what it is, as measured
  std::string bf16_path;  // what the bf16 rows' GFLOP/s column ran; empty without bf16 rows
  nlohmann::json to_json() const;
  Table to_table() const;
  std::string summary_text() const;
};

// The shapes a preset sweeps. Throws InputError for bad options.
std::vector<GemmCase> gemm_cases(const GemmBenchOptions& options);

GemmBenchResult run_gemm_bench(const GemmBenchOptions& options);

// Fills each (dtype, threads) group's summary and the rows' pct_of_peak.
void summarize_gemm(GemmBenchResult& result, const std::vector<std::string>& dtypes,
                    const std::vector<int>& threads);

// Records the measured shapes (at the most threads measured) in a hardware
// profile's gemm_shapes (the grid preset: its gemm_grid), replacing earlier
// entries of the same shape, dtype and transposition: `anvil plan` prices a
// GEMM of a shape in gemm_shapes at its rate, and every other shape from the
// surface gemm_grid spans.
void add_to_profile(const GemmBenchResult& result, plan::HwProfile& profile);

// The smallest work from which every point reaches `fraction` of `peak`.
double work_for_fraction(std::vector<std::pair<double, double>> flops_and_gflops, double peak,
                         double fraction);

// Child side of the library/env baselines: reads a spec written by the
// parent, times the raw library sgemm, prints JSON on stdout.
int run_raw_blas_child(const std::string& spec_path);

}  // namespace anvil::bench
