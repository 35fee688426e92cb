// Benchmark plumbing (not timing): which shapes a preset sweeps, how the
// 90%-of-peak work is derived, and that results come back complete.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "anvil/base/error.hpp"
#include "anvil/bench/comm_bench.hpp"
#include "anvil/bench/gemm_bench.hpp"
#include "anvil/bench/membw_bench.hpp"
#include "anvil/device/gemm.hpp"

namespace anvil::bench {
namespace {

CommPoint comm_point(const std::string& algo, int64_t bytes, double us) {
  CommPoint p;
  p.op = "allreduce";
  p.algo = algo;
  p.bytes = bytes;
  p.p50_us = us;
  return p;
}

TEST(CommRefine, SplitsOnlyTheIntervalsWhereTimePerByteStepsUp) {
  const int64_t M = int64_t{1} << 20;
  // ring: bandwidth-bound at 1 us/MiB up to 16M, 3 us/MiB from 32M (a cache
  // step between 16M and 32M); mpi: latency-bound, time per byte falling.
  std::vector<CommPoint> pts;
  for (int64_t mib : {4, 8, 16, 32, 64}) {
    pts.push_back(comm_point("mpi", mib * M, 100.0 + mib));
    pts.push_back(comm_point("ring", mib * M, mib <= 16 ? mib * 1.0 : mib * 3.0));
  }
  pts.push_back(comm_point("ring", 0, 5.0));  // zero bytes: ignored
  const auto extra = refine_sizes(pts, "allreduce", 1.5, 4);
  ASSERT_EQ(extra.size(), 2u);
  // 16M x 2^(1/3) and 16M x 2^(2/3), rounded down to 4 bytes: never the
  // geometric midpoint (22.6M) that the validation holds out.
  EXPECT_EQ(extra[0], static_cast<int64_t>(16.0 * M * std::cbrt(2.0)) / 4 * 4);
  EXPECT_EQ(extra[1], static_cast<int64_t>(16.0 * M * std::cbrt(4.0)) / 4 * 4);
  EXPECT_NE(extra[0], static_cast<int64_t>(16.0 * M * std::sqrt(2.0)) / 4 * 4);
  // Below the threshold, for another op, or once narrower than
  // kMinRefineStep: nothing.
  EXPECT_TRUE(refine_sizes(pts, "allreduce", 3.5, 4).empty());
  EXPECT_TRUE(refine_sizes(pts, "allgather", 1.5, 4).empty());
  const std::vector<CommPoint> close = {comm_point("ring", 16 * M, 16.0),
                                        comm_point("ring", 18 * M, 60.0)};
  EXPECT_TRUE(refine_sizes(close, "allreduce", 1.5, 4).empty());
}

TEST(GemmCases, SquareDefaultsAndSizes) {
  GemmBenchOptions o;
  EXPECT_EQ(gemm_cases(o).size(), 5u);
  o.sizes = {7, 9};
  const auto cases = gemm_cases(o);
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[1].m, 9);
  EXPECT_EQ(cases[1].k, 9);
}

TEST(GemmCases, AlignedSweepsExactMultiples) {
  GemmBenchOptions o;
  o.preset = "aligned";
  o.sizes = {1000};
  const auto cases = gemm_cases(o);
  ASSERT_EQ(cases.size(), 6u);
  EXPECT_EQ(cases[0].m, 1000);
  EXPECT_EQ(cases[1].m, 1025);
  EXPECT_EQ(cases[1].label, "mult of 1");
  EXPECT_EQ(cases[2].label, "mult of 8");
  EXPECT_EQ(cases[3].label, "mult of 16");
  EXPECT_EQ(cases[4].label, "mult of 64");
  EXPECT_EQ(cases[5].m, 1152);
  EXPECT_EQ(cases[5].label, "mult of 128");
}

TEST(GemmCases, GridSweepsEveryShapeInTheThreeTranspositionsUnderTheWorkCap) {
  GemmBenchOptions o;
  o.preset = "grid";
  o.sizes = {64, 4096};
  const auto cases = gemm_cases(o);
  // 8 shapes, minus 4096^3 (137 GFLOP, over kGridMaxFlops), x fwd/dgrad/wgrad.
  ASSERT_EQ(cases.size(), 7u * 3);
  for (size_t i = 0; i < cases.size(); i += 3) {
    EXPECT_EQ(cases[i].label, "grid.fwd");
    EXPECT_TRUE(!cases[i].trans_a && cases[i].trans_b);
    EXPECT_TRUE(!cases[i + 1].trans_a && !cases[i + 1].trans_b);
    EXPECT_TRUE(cases[i + 2].trans_a && !cases[i + 2].trans_b);
    EXPECT_LE(cases[i].flops(), kGridMaxFlops);
  }
  // Measured grid rows go to the profile's gemm_grid, not its exact shapes.
  GemmBenchResult r;
  r.preset = "grid";
  GemmRow row;
  row.shape = cases[0];
  row.dtype = "f32";
  row.threads = 2;
  row.gflops = 42;
  r.rows = {row};
  plan::HwProfile p;
  add_to_profile(r, p);
  ASSERT_EQ(p.gemm_grid.size(), 1u);
  EXPECT_TRUE(p.gemm_shapes.empty());
  EXPECT_EQ(p.gemm_grid[0].gflops, 42);
}

TEST(GemmCases, ModelPresetNeedsAConfig) {
  GemmBenchOptions o;
  o.preset = "model";
  EXPECT_THROW(gemm_cases(o), InputError);
  o.config_path = std::string(ANVIL_SOURCE_DIR) + "/configs/zaya1-base.json";
  o.tokens = 4096;
  const auto cases = gemm_cases(o);
  bool saw_expert = false;
  for (const auto& c : cases) {
    if (c.label == "expert.up.fwd") {
      saw_expert = true;
      EXPECT_EQ(c.m, 256);  // 4096 tokens x top-1 / 16 experts
    }
  }
  EXPECT_TRUE(saw_expert);
}

TEST(WorkForFraction, SmallestWorkFromWhichAllPointsReachTheBar) {
  // (flops, gflops) with peak 100: 90% first holds from 1e8 on.
  const std::vector<std::pair<double, double>> pts = {
      {1e6, 20}, {1e7, 91}, {3e7, 70}, {1e8, 92}, {1e9, 100}};
  EXPECT_EQ(work_for_fraction(pts, 100, 0.9), 1e8);
  EXPECT_TRUE(std::isnan(work_for_fraction({{1e6, 10}}, 100, 0.9)));
  EXPECT_TRUE(std::isnan(work_for_fraction({}, 100, 0.9)));
}

TEST(GemmBench, RunsEveryShapeDtypeAndThreadCount) {
  GemmBenchOptions o;
  o.sizes = {8, 16};
  o.dtypes = {"f32", "bf16"};
  o.threads = {1, 2};
  o.baselines = {"naive"};
  o.timing.min_seconds = 0.001;
  const auto r = run_gemm_bench(o);
  ASSERT_EQ(r.rows.size(), 8u);
  ASSERT_EQ(r.summaries.size(), 4u);
  // Each (dtype, threads) group's peak is its best row, and every row's
  // %peak is its GFLOP/s over that peak.
  for (const auto& s : r.summaries) {
    double best = 0;
    for (const auto& row : r.rows) {
      if (row.dtype != s.dtype || row.threads != s.threads) continue;
      best = std::max(best, row.gflops);
      EXPECT_NEAR(row.pct_of_peak, 100.0 * row.gflops / s.peak_gflops, 1e-9)
          << row.dtype << " " << row.threads << "T " << row.shape.m;
    }
    EXPECT_EQ(s.peak_gflops, best) << s.dtype << " " << s.threads << "T";
  }
  // bf16 rows name their path; the other path is measured beside them
  // exactly where the CPU can run both.
  EXPECT_FALSE(r.bf16_path.empty());
  const char* other =
      device::bf16_path() == device::Bf16Path::native ? "bf16-emulated" : "bf16-native";
  for (const auto& row : r.rows) {
    EXPECT_GT(row.gflops, 0);
    EXPECT_EQ(row.baseline_gflops.count("naive"), 1u);
    EXPECT_EQ(row.baseline_gflops.count(other),
              row.dtype == "bf16" && device::bf16_native_available() ? 1u : 0u);
  }
  const auto j = r.to_json();
  EXPECT_EQ(j["rows"].size(), 8u);
  EXPECT_EQ(r.to_table().rows().size(), 8u);
}

// --passes pools each shape's calls over the sweeps: one row per shape as
// with one pass, at least min_samples calls from every pass behind it.
TEST(GemmBench, PassesPoolEachShapesSamplesIntoOneRow) {
  GemmBenchOptions o;
  o.sizes = {8, 16, 24};
  o.baselines = {"naive"};
  o.threads = {1};
  o.timing.min_seconds = 0.001;
  o.passes = 3;
  const auto r = run_gemm_bench(o);
  ASSERT_EQ(r.rows.size(), 3u);
  for (const auto& row : r.rows) {
    EXPECT_GT(row.gflops, 0);
    EXPECT_GE(row.gflops_best, row.gflops);
    EXPECT_EQ(row.baseline_gflops.count("naive"), 1u);  // the last pass times the baselines
  }
}

TEST(GemmBench, RejectsBadOptions) {
  GemmBenchOptions o;
  o.passes = 0;
  EXPECT_THROW(run_gemm_bench(o), InputError);
  o = GemmBenchOptions{};
  o.dtypes = {"f16"};
  EXPECT_THROW(run_gemm_bench(o), InputError);
  o = GemmBenchOptions{};
  o.threads = {0};
  EXPECT_THROW(run_gemm_bench(o), InputError);
  o = GemmBenchOptions{};
  o.preset = "cubes";
  EXPECT_THROW(gemm_cases(o), InputError);
}

TEST(MembwBench, EveryKernelSizeAndThreadCountGivesARow) {
  MembwOptions o;
  o.sizes = {16 << 10, 64 << 10};
  o.threads = {1, 2};
  o.min_seconds = 0.001;
  const auto r = run_membw_bench(o);
  ASSERT_EQ(r.rows.size(), 6u * 2 * 2);
  for (const auto& row : r.rows) {
    EXPECT_GT(row.gbs, 0);
    EXPECT_LE(row.pct_of_best, 100.0 + 1e-9);
    EXPECT_LE(row.bytes, 64 << 10);
  }
}

TEST(MembwBench, RejectsUnknownKernelAndTinySizes) {
  MembwOptions o;
  o.kernels = {"gather"};
  EXPECT_THROW(run_membw_bench(o), InputError);
  o = MembwOptions{};
  o.sizes = {100};
  EXPECT_THROW(run_membw_bench(o), InputError);
}

}  // namespace
}  // namespace anvil::bench
