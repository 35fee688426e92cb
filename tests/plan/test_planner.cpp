// The model calculator and the performance model: FLOPs, memory, bytes on the
// wire and the reliability arithmetic against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "anvil/base/error.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/context_parallel.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/param_count.hpp"
#include "anvil/optim/muon.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/plan/model_calc.hpp"
#include "anvil/plan/perf_model.hpp"

namespace anvil::plan {
namespace {

const std::string kSource = ANVIL_SOURCE_DIR;

model::ModelConfig preset(const std::string& name) {
  return model::load_model_config(kSource + "/configs/" + name + ".json");
}

HwProfile gpu_node() {
  HwProfile hw;
  hw.name = "test-gpu";
  hw.kind = "gpu";
  hw.compute_units = 100;
  hw.memory_bytes = int64_t{80} << 30;
  hw.memory_bandwidth_gbs = 1000;
  hw.peak = {{"bf16", 0, 1000e3}, {"f32", 0, 100e3}};
  hw.interconnect = {8, "links", 400, 8, 400, "rails-only"};
  return hw;
}

// One micro-batch of B x T per step on one rank, in `dtype`.
PlanOptions one_batch(int64_t B, int64_t T, const std::string& dtype) {
  PlanOptions o;
  o.layout.micro_batch = B;
  o.layout.seq = T;
  o.layout.global_batch = B;
  o.layout.dtype = dtype;
  return o;
}

// A 2-core CPU profile: f32 at 80 GFLOP/s on one thread and 150 on two,
// DRAM at 30 GB/s.
HwProfile cpu_node() {
  HwProfile cpu;
  cpu.name = "cpu";
  cpu.kind = "cpu";
  cpu.compute_units = 2;
  cpu.memory_bytes = int64_t{16} << 30;
  cpu.peak = {{"f32", 1, 80}, {"f32", 2, 150}};
  cpu.memory_levels = {{"DRAM", int64_t{1} << 30, 2, 30}};
  return cpu;
}

TEST(Planner, DenseFlopsPerTokenMatchTheTrainersCount) {
  for (const char* name : {"gpt2-124m", "llama-style", "byte-small"}) {
    const auto c = preset(name);
    for (int64_t T : {64, 256, 1024}) {
      EXPECT_NEAR(flops_per_token(c, T).training() / model::training_flops_per_token(c, T), 1.0,
                  1e-12)
          << name << " T=" << T;
    }
  }
}

TEST(Planner, ZayaFlopsAddTheRouterMlpAndConvolutionToTheActiveWeights) {
  const auto c = preset("zaya1-base");
  const double ratio =
      flops_per_token(c, 4096).training() / model::training_flops_per_token(c, 4096);
  // The trainer's count is 6 x active weights; the calculator prices the same
  // GEMMs shape by shape (router MLP, grouped conv) and agrees within 2%.
  EXPECT_NEAR(ratio, 1.0, 0.02);
}

TEST(Planner, ZeroOneShardsOptimizerStateAndExpertParallelShardsExperts) {
  const auto c = preset("zaya1-base");
  Layout l;
  l.seq = 4096;
  l.devices_per_node = 8;
  l.global_batch = 8;
  const MemoryPerRank plain = memory_per_rank(c, l);
  l.zero1 = true;
  const MemoryPerRank zero = memory_per_rank(c, l);
  EXPECT_NEAR(zero.optimizer * 8, plain.optimizer, plain.optimizer * 1e-12);
  EXPECT_EQ(zero.weights, plain.weights);
  l.zero1 = false;
  l.ep = 8;
  const LocalParams ep = local_params(c, l);
  l.ep = 1;
  const LocalParams all = local_params(c, l);
  EXPECT_NEAR(ep.expert * 8, all.expert, 1);
  EXPECT_EQ(ep.replicated, all.replicated);
  // AdamW: 8 bytes of state per parameter; bf16 weights keep an fp32 master.
  EXPECT_NEAR(plain.optimizer, 8 * all.total(), 1);
  EXPECT_NEAR(plain.weights, 6 * all.total(), 1);
  EXPECT_NEAR(plain.gradients, 4 * all.total(), 1);
  // Accumulating keeps the earlier micro-batches' sum: a second fp32 buffer.
  Layout accum = l;
  accum.global_batch = 16;
  ASSERT_EQ(accum.accumulation(), 2);
  EXPECT_NEAR(memory_per_rank(c, accum).gradients, 8 * all.total(), 1);
  l.recompute = true;
  EXPECT_LT(memory_per_rank(c, l).activations, plain.activations / 4);
}

TEST(Planner, CommunicationBytesPerStep) {
  const auto c = preset("zaya1-base");
  Layout l;
  l.seq = 4096;
  l.devices_per_node = 8;
  l.nodes = 2;
  l.global_batch = 32;  // 2 micro-batches per rank
  const LocalParams p = local_params(c, l);
  auto ops = comm_per_step(c, l);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].op, "allreduce");
  EXPECT_EQ(ops[0].ranks, 16);
  EXPECT_NEAR(ops[0].bytes, 4 * p.total(), 1);
  l.zero1 = true;
  ops = comm_per_step(c, l);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].op, "reduce_scatter");
  EXPECT_EQ(ops[1].op, "allgather");
  EXPECT_NEAR(ops[1].bytes, 2 * p.total(), 1);  // bf16 parameters
  l.ep = 8;
  ops = comm_per_step(c, l);
  const CommOp& a2a = ops.back();
  EXPECT_EQ(a2a.op, "alltoall");
  EXPECT_EQ(a2a.calls, 4 * c.n_layers * 2);
  EXPECT_NEAR(a2a.bytes, 4096.0 * c.d_model * 2, 1);
}

TEST(Planner, CollectivesFromLinksAndFromMeasuredFits) {
  HwProfile hw = gpu_node();
  const double S = 1e9;
  // One node of 8: ring all-reduce = 2 x 7/8 x S over the links + 2 x 7 alphas.
  const double intra = 400e9 * kDefaultAchievableLink;
  const double alpha = kIntraNodeAlphaUs * 1e-6;
  EXPECT_NEAR(price_collective(hw, "allreduce", 8, 8, S).seconds,
              2 * (7.0 / 8 * S / intra + 7 * alpha), 1e-12);
  // Two nodes: each device's 1/8 share crosses its own 400 Gb/s rail.
  const double rail = 50e9 * kDefaultAchievableLink;
  EXPECT_NEAR(price_collective(hw, "reduce_scatter", 16, 8, S).seconds,
              7.0 / 8 * S / intra + 7 * alpha + 0.5 * (S / 8) / rail + kInterNodeAlphaUs * 1e-6,
              1e-12);
  // A measured fit for the rank count wins: alpha + bytes / bandwidth.
  hw.comm = {{"ranks",
              {{"2",
                {{"allreduce",
                  {{"shm", {{"alpha_us", 3.0}, {"bandwidth_gbs", 10.0}}},
                   {"mpi", {{"alpha_us", 9.0}, {"bandwidth_gbs", 2.0}}}}}}}}}};
  const CommPrice fit = price_collective(hw, "allreduce", 2, 8, 1e6);
  EXPECT_NEAR(fit.seconds, 3e-6 + 1e6 / 10e9, 1e-15);
  EXPECT_NE(fit.how.find("shm"), std::string::npos);
  EXPECT_NEAR(price_collective(hw, "allreduce", 2, 8, 1e6, "mpi").seconds, 9e-6 + 1e6 / 2e9, 1e-15);
  EXPECT_THROW(price_collective(hw, "gather", 8, 8, S), InputError);
  // Measured points win inside their range (log-log), and scale past the last.
  hw.comm["ranks"]["2"]["allreduce"]["shm"]["points"] = {{1e6, 100.0}, {4e6, 800.0}};
  EXPECT_NEAR(price_collective(hw, "allreduce", 2, 8, 2e6, "shm").seconds,
              std::sqrt(100.0 * 800.0) * 1e-6, 1e-12);
  EXPECT_NEAR(price_collective(hw, "allreduce", 2, 8, 8e6, "shm").seconds, 1600e-6, 1e-12);
  EXPECT_NEAR(price_collective(hw, "allreduce", 2, 8, 1e5, "shm").seconds, 3e-6 + 1e5 / 10e9,
              1e-15);  // below the points: the fit
}

TEST(Planner, GemmEfficiencyFollowsTheMeasuredCurve) {
  HwProfile hw;
  hw.name = "cpu";
  hw.kind = "cpu";
  hw.peak = {{"f32", 2, 100}};
  hw.memory_bandwidth_gbs = 1e6;  // never memory bound here
  hw.gemm_efficiency = {{"f32", {{1e6, 0.2}, {1e8, 0.8}}}};
  EXPECT_NEAR(curve_efficiency(hw, "f32", 1e5), 0.2, 1e-12);  // clamped
  EXPECT_NEAR(curve_efficiency(hw, "f32", 1e7), 0.5, 1e-12);  // log-linear midpoint
  EXPECT_NEAR(curve_efficiency(hw, "f32", 1e9), 0.8, 1e-12);
  const GemmPrice g = price_gemm(hw, "f32", 1000, 1000, 1000);  // 2e9 FLOPs
  EXPECT_NEAR(g.seconds, 2e9 / (100e9 * 0.8), 1e-12);
  EXPECT_THROW(price_gemm(hw, "bf16", 8, 8, 8), InputError);  // no bf16 peak
  // A shape measured into the profile is priced at its measured rate, and only that shape.
  hw.gemm_shapes = {{"f32", 1000, 1000, 1000, false, true, 2, 50}};
  const GemmPrice m = price_gemm(hw, "f32", 1000, 1000, 1000, false, true);
  EXPECT_TRUE(m.measured);
  EXPECT_NEAR(m.seconds, 2e9 / 50e9, 1e-12);
  EXPECT_FALSE(price_gemm(hw, "f32", 1000, 1000, 1000, true, false).measured);
}

TEST(Planner, GemmGridIsInterpolatedMultilinearlyInLogSpace) {
  HwProfile hw;
  hw.name = "cpu";
  hw.kind = "cpu";
  hw.peak = {{"f32", 2, 100}};
  hw.memory_bandwidth_gbs = 1e6;
  // A 2 x 2 x 2 grid at 64 and 4096 (forward transposition): rate = 10 + 20
  // per upper m, + 40 per upper n, + 5 per upper k (linear in log-weights).
  for (int64_t m : {64, 4096})
    for (int64_t n : {64, 4096})
      for (int64_t k : {64, 4096})
        hw.gemm_grid.push_back({"f32", m, n, k, false, true, 2,
                                10.0 + (m > 64 ? 20 : 0) + (n > 64 ? 40 : 0) + (k > 64 ? 5 : 0)});
  // A corner is itself; 512 is halfway between 64 and 4096 in log space.
  EXPECT_NEAR(grid_gflops(hw, "f32", 4096, 64, 4096, false, true), 35, 1e-9);
  EXPECT_NEAR(grid_gflops(hw, "f32", 512, 64, 64, false, true), 20, 1e-9);
  EXPECT_NEAR(grid_gflops(hw, "f32", 512, 512, 512, false, true), 10 + 10 + 20 + 2.5, 1e-9);
  // Clamped outside the grid.
  EXPECT_NEAR(grid_gflops(hw, "f32", 16, 100000, 4096, false, true), 55, 1e-9);
  // No point of that transposition: the others answer; another dtype: none.
  EXPECT_NEAR(grid_gflops(hw, "f32", 64, 64, 64, true, false), 10, 1e-9);
  EXPECT_EQ(grid_gflops(hw, "bf16", 64, 64, 64, false, true), 0);
  // A corner the sweep skipped drops out, the others reweighted.
  hw.gemm_grid.pop_back();  // (4096, 4096, 4096)
  EXPECT_NEAR(grid_gflops(hw, "f32", 4096, 4096, 512, false, true), 70, 1e-9);
  // price_gemm uses the surface for a shape not measured exactly.
  const GemmPrice g = price_gemm(hw, "f32", 512, 64, 64, false, true);
  EXPECT_TRUE(g.surface);
  EXPECT_FALSE(g.measured);
  EXPECT_NEAR(g.seconds, g.flops / 20e9, 1e-15);
}

TEST(Planner, PublishedFiguresAreDeratedByOneRuleAndAssumeOverridesIt) {
  ::setenv("ANVIL_PROFILES", (kSource + "/profiles").c_str(), 1);
  HwProfile mi = find_hw_profile("mi300x", "--hw");
  HwProfile h200 = find_hw_profile("h200-sxm", "--hw");
  // Datasheet x the profile's published achievable fraction, else the default.
  EXPECT_NEAR(memory_gbs(mi), 5300 * mi.achievable.memory, 1e-9);
  EXPECT_NEAR(memory_gbs(h200), 4800 * kDefaultAchievableMemory, 1e-9);
  EXPECT_NEAR(curve_efficiency(mi, "bf16", 1e12), mi.achievable.gemm.at("bf16"), 1e-12);
  EXPECT_NEAR(curve_efficiency(mi, "f32", 1e12), kDefaultAchievableGemm, 1e-12);
  // Links are per direction: 8 ranks' ring all-reduce over 448 GB/s x achievable.
  EXPECT_EQ(mi.interconnect.intra_node_gbs, 448);
  const double S = 1e9;
  const double link = 448e9 * achievable_link(mi);
  EXPECT_NEAR(price_collective(mi, "allreduce", 8, 8, S).seconds,
              2 * (7.0 / 8 * S / link + 7 * kIntraNodeAlphaUs * 1e-6), 1e-12);
  apply_assumption(mi, "memory=0.5");
  apply_assumption(mi, "gemm.bf16=0.6");
  apply_assumption(mi, "link=1");
  EXPECT_NEAR(memory_gbs(mi), 2650, 1e-9);
  EXPECT_NEAR(curve_efficiency(mi, "bf16", 1e12), 0.6, 1e-12);
  EXPECT_NEAR(price_collective(mi, "allreduce", 8, 8, S).seconds,
              2 * (7.0 / 8 * S / 448e9 + 7 * kIntraNodeAlphaUs * 1e-6), 1e-12);
  for (const char* bad : {"memory", "memory=0", "memory=1.5", "hbm=0.5", "gemm.f99=0.5", "link=x"})
    EXPECT_THROW(apply_assumption(mi, bad), InputError) << bad;
}

TEST(Planner, MeasuredRoutingPricesEachExpertAtItsRows) {
  const auto c = preset("zaya-small");  // 16 experts, top-1
  Layout l;
  l.micro_batch = 4;
  l.seq = 256;
  l.global_batch = 4;
  // Experts 0..7 take 3/32 each, 8..15 1/32, no skips (balanced: 1/16 each).
  l.expert_shares.assign(17, 0.0);
  for (int e = 0; e < 16; ++e) l.expert_shares[e] = e < 8 ? 3.0 / 32 : 1.0 / 32;
  auto rows_of = [&](const Layout& layout) {
    std::map<int64_t, int64_t> rows;  // rows -> expert.up.fwd GEMMs
    for (const auto& g : step_gemms(c, layout, false))
      if (g.shape.name == "expert.up.fwd") rows[g.shape.m] += g.count;
    return rows;
  };
  EXPECT_EQ(rows_of(l), (std::map<int64_t, int64_t>{{32, 8 * c.n_layers}, {96, 8 * c.n_layers}}));
  // EP 2 over 2 ranks: the busiest rank holds experts 0..7 and gets rows from both ranks.
  l.devices_per_node = 2;
  l.ep = 2;
  l.global_batch = 8;
  EXPECT_EQ(rows_of(l), (std::map<int64_t, int64_t>{{192, 8 * c.n_layers}}));
  // Balanced: tokens x top_k x ep / experts rows each.
  l.expert_shares.clear();
  EXPECT_EQ(rows_of(l), (std::map<int64_t, int64_t>{{128, 8 * c.n_layers}}));
  // From a run's metrics.jsonl: averaged over steps and layers, skip last.
  const std::string dir = ::testing::TempDir() + "anvil-expert-loads";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/metrics.jsonl");
    std::string a = "[", b = "[";
    for (int e = 0; e < 17; ++e) {
      a += std::string(e ? "," : "") + (e == 16 ? "64" : e < 8 ? "96" : "32");
      b += std::string(e ? "," : "") + (e == 16 ? "0" : "64");
    }
    f << R"({"step":1,"router":[{"layer":1,"load":)" << a << R"(]},{"layer":3,"load":)" << b
      << "]}]}\n{\"step\":2}\n";
  }
  const auto shares = expert_shares_from_metrics(dir, 16);
  ASSERT_EQ(shares.size(), 17u);
  EXPECT_NEAR(shares[16], 64.0 / 2112, 1e-12);
  EXPECT_NEAR(shares[0], (96.0 + 64) / 2112, 1e-12);
  EXPECT_THROW(expert_shares_from_metrics(dir, 8), InputError);  // another expert count
  EXPECT_THROW(expert_shares_from_metrics(dir + "/none.jsonl", 16), InputError);
}

TEST(Planner, StepPredictionAddsUpAndReliabilityFollowsYoungDaly) {
  const auto c = preset("gpt2-124m");
  PlanOptions o;
  o.layout.devices_per_node = 8;
  o.layout.nodes = 4;
  o.layout.micro_batch = 4;
  o.layout.seq = 1024;
  o.layout.global_batch = 256;
  o.layout.zero1 = true;
  o.mttf_hours = 10000;
  o.ckpt_gbs_per_node = 1;
  o.restart_s = 300;
  const Prediction p = predict_step(c, gpu_node(), o);
  EXPECT_NEAR(p.step_s, p.compute_s + p.comm_exposed_s + p.optimizer_s, 1e-12);
  EXPECT_LE(p.comm_exposed_s, p.comm_s + 1e-15);
  EXPECT_NEAR(p.tokens_per_s, 256.0 * 1024 / p.step_s, 1e-6);
  EXPECT_NEAR(p.failures_per_day, 32 * 24 / 10000.0, 1e-12);
  const double M = 10000.0 * 3600 / 32;
  EXPECT_NEAR(p.system_mttf_s, M, 1e-6);
  EXPECT_NEAR(p.young_daly_s, std::sqrt(2 * p.ckpt_save_s * M), 1e-9);
  EXPECT_NEAR(p.ckpt_save_s, p.ckpt_bytes / (1e9 * 4), 1e-9);
  EXPECT_GT(p.goodput, 0.9);
  EXPECT_LT(p.goodput, 1.0);
}

// Every second of the step lands in exactly one model term, each with a
// formula and a source; --explain prints them.
TEST(Planner, ModelTermsAddUpToTheStepAndNameTheirSources) {
  const auto c = preset("zaya-small");
  PlanOptions o;
  o.layout.devices_per_node = 8;
  o.layout.micro_batch = 2;
  o.layout.seq = 2048;
  o.layout.global_batch = 64;
  o.layout.pp = 2;
  o.layout.recompute = true;
  for (const std::string dtype : {"bf16", "f32"}) {
    o.layout.dtype = dtype;
    const Prediction p = predict_step(c, gpu_node(), o);
    double sum = 0;
    std::map<std::string, double> by_name;
    for (const auto& t : p.terms) {
      EXPECT_GE(t.seconds, 0) << t.name;
      EXPECT_FALSE(t.how.empty()) << t.name;
      EXPECT_FALSE(t.source.empty()) << t.name;
      sum += t.seconds;
      by_name[t.name] += t.seconds;
    }
    EXPECT_NEAR(sum, p.step_s, 1e-9 * p.step_s) << dtype;
    for (const char* name : {"GEMMs at the plateau", "small-GEMM efficiency", "recompute",
                             "pipeline bubble", "memory-bound: element-wise",
                             "memory-bound: moe dispatch + combine",
                             "memory-bound: optimizer step", "exposed communication"})
      EXPECT_TRUE(by_name.count(name)) << name;
    EXPECT_GT(by_name["GEMMs at the plateau"], 0);
    const std::string text = explain_text(p);
    EXPECT_NE(text.find("sources:"), std::string::npos);
    EXPECT_NE(text.find("[1]"), std::string::npos);
  }
}

// fp8 runs the layers' GEMMs in fp8 and pays for casting their inputs and
// output gradients (4 B per element); the classifier stays in bf16.
TEST(Planner, Fp8CastsTheLayersGemmOperandsAndKeepsTheClassifierInBf16) {
  const auto c = preset("llama-style");
  HwProfile hw = gpu_node();
  hw.peak.push_back({"fp8", 0, 2000e3});
  PlanOptions o = one_batch(1, 1024, "fp8");
  o.layout.devices_per_node = 1;
  const Prediction p = predict_step(c, hw, o);
  double expected_bytes = 0;
  for (const auto& g : step_gemms(c, o.layout, true)) {
    if (g.shape.name.rfind("lm_head", 0) == 0 || g.shape.name.ends_with(".wgrad")) continue;
    expected_bytes += 4.0 * static_cast<double>(g.shape.m * g.shape.k * g.count);
  }
  bool casts = false;
  for (const auto& part : p.compute) {
    if (part.kind == "gemm") {
      EXPECT_EQ(part.dtype, part.name.rfind("lm_head", 0) == 0 ? "bf16" : "fp8") << part.name;
    }
    if (part.name == "fp8 casts") {
      casts = true;
      EXPECT_NEAR(part.seconds, expected_bytes / (memory_gbs(hw) * 1e9), 1e-12);
    }
  }
  EXPECT_TRUE(casts);
  o.layout.dtype = "bf16";
  for (const auto& part : predict_step(c, hw, o).compute) EXPECT_NE(part.name, "fp8 casts");
}

// A CPU's bf16 GEMMs convert their fp32 activations: per linear layer its
// input for the forward, its output gradient and input again for the
// backward (6 B per element at the memory bandwidth); a GPU converts nothing.
// Muon's Newton-Schulz: its GEMMs at the rate of the dtype it multiplies in
// (anvil train --muon-bf16: bf16), and its element-wise passes at the
// in-place memory rate, counted per matrix as optim/muon.cpp moves them.
TEST(Planner, MuonPricesNewtonSchulzInItsDtypeAndCountsItsPasses) {
  // [512, 1024] (ZAYA1-small's expert gate/up in its wide orientation):
  // 20 B an element in and out, 5 iterations of X's copy (8 B; 10 rounded
  // to bf16 too) and the Gram matrices' copies and mirrors (16 B; 12).
  const double x = 512.0 * 1024, gram = 512.0 * 512;
  EXPECT_DOUBLE_EQ(newton_schulz_bytes(512, 1024, false), 20 * x + 5 * (8 * x + 16 * gram));
  EXPECT_DOUBLE_EQ(newton_schulz_bytes(512, 1024, true), 20 * x + 5 * (10 * x + 12 * gram));

  HwProfile cpu = cpu_node();
  cpu.peak.push_back({"bf16", 2, 300});  // twice f32's 150
  const auto c = preset("gpt2-124m");
  PlanOptions o;
  o.layout.dtype = "f32";
  o.layout.seq = 64;
  o.layout.optimizer = "muon";
  auto optimizer_s = [&](bool bf16) {
    o.layout.muon_bf16 = bf16;
    return predict_step(c, cpu, o).optimizer_s;
  };
  // Memory all but free: the GEMMs alone, twice as fast in bf16.
  cpu.memory_levels[0].gbs = 1e12;
  EXPECT_NEAR(optimizer_s(true) / optimizer_s(false), 0.5, 1e-6);
  // At the profile's rates: the difference is each matrix's Newton-Schulz
  // GEMMs priced in bf16 rather than f32, and its passes' bytes (in place:
  // 4/3 of the profile's 30 GB/s triad rate).
  cpu.memory_levels[0].gbs = 30;
  double want = 0;
  for (const auto& g : step_gemms(c, o.layout, false)) {
    if (g.shape.name == "lm_head.fwd") continue;
    const int64_t r = std::min(g.shape.n, g.shape.k), cols = std::max(g.shape.n, g.shape.k);
    const double share = optim::gram_flop_share(r);
    auto gemms = [&](const char* dtype) {
      return 5 * ((1 + share) * price_gemm(cpu, dtype, r, r, cols).seconds +
                  share * price_gemm(cpu, dtype, r, r, r).seconds);
    };
    want += (gemms("bf16") - gemms("f32") +
             (newton_schulz_bytes(r, cols, true) - newton_schulz_bytes(r, cols, false)) / 40e9) *
            static_cast<double>(g.count);
  }
  EXPECT_NEAR((optimizer_s(true) - optimizer_s(false)) / want, 1.0, 1e-9);
}

TEST(Planner, CpuBf16ConvertsEachLinearLayersActivations) {
  const auto c = preset("gpt2-124m");
  HwProfile cpu = cpu_node();
  cpu.peak.push_back({"bf16", 2, 300});
  PlanOptions o = one_batch(4, 256, "bf16");
  const auto conversions = [&](const HwProfile& hw) {
    for (const auto& part : predict_step(c, hw, o).compute)
      if (part.name == "bf16 input conversions") return part.seconds;
    return 0.0;
  };
  double elements = 0;
  for (const auto& g : step_gemms(c, o.layout, true))
    if (g.shape.name.ends_with(".fwd"))
      elements += static_cast<double>(g.shape.m * (2 * g.shape.k + g.shape.n) * g.count);
  // gpt2-124m, 1024 tokens: 12 layers x 1024 x (3840 + 2304 + 4608 + 6912) + the classifier
  // 1024 x (1536 + 50304).
  EXPECT_DOUBLE_EQ(elements, 1024.0 * (12 * (3840 + 2304 + 4608 + 6912) + 1536 + 50304));
  EXPECT_NEAR(conversions(cpu), 6 * elements / 30e9, 1e-12);
  o.layout.dtype = "f32";
  EXPECT_EQ(conversions(cpu), 0.0);
  o.layout.dtype = "bf16";
  o.layout.devices_per_node = 1;
  EXPECT_EQ(conversions(gpu_node()), 0.0);
}

// On a CPU each GEMM's weight side comes from DRAM: the forward and the
// dgrad read the weight in the dtype they multiply, the wgrad reads and
// writes its fp32 gradient (8 B). GPUs overlap it, and the term is zero.
TEST(Planner, CpuGemmsPayTheirWeightsTrafficFromDram) {
  const auto c = preset("gpt2-124m");
  HwProfile cpu = cpu_node();
  cpu.peak.push_back({"bf16", 2, 300});
  PlanOptions o = one_batch(2, 256, "f32");
  for (const char* dtype : {"f32", "bf16"}) {
    o.layout.dtype = dtype;
    const Prediction p = predict_step(c, cpu, o);
    const double w = std::string(dtype) == "bf16" ? 2.0 : 4.0;
    for (const auto& part : p.compute) {
      if (part.kind != "gemm") continue;
      for (const auto& g : step_gemms(c, o.layout, true)) {
        if (g.shape.name != part.name) continue;
        const double elements = g.shape.name.ends_with(".wgrad")
                                    ? static_cast<double>(g.shape.m * g.shape.n)
                                    : static_cast<double>(g.shape.n * g.shape.k);
        const double bytes = (g.shape.name.ends_with(".wgrad") ? 8.0 : w) * elements;
        EXPECT_NEAR(part.weights_s, bytes * static_cast<double>(g.count) / 30e9,
                    1e-9 * part.weights_s)
            << dtype << " " << part.name;
        EXPECT_GT(part.seconds, part.weights_s);
      }
    }
    // --explain shows it as its own term, and the terms still add up.
    double weights = 0, total = 0;
    for (const auto& part : p.compute) weights += part.weights_s;
    for (const auto& t : p.terms) {
      total += t.seconds;
      if (t.name == "memory-bound: GEMM weights from DRAM") {
        EXPECT_NEAR(t.seconds, weights, 1e-12);
      }
    }
    EXPECT_GT(weights, 0.0);
    EXPECT_NEAR(total, p.step_s, 1e-9 * p.step_s);
  }
  o.layout.dtype = "bf16";
  o.layout.devices_per_node = 1;
  for (const auto& part : predict_step(c, gpu_node(), o).compute) EXPECT_EQ(part.weights_s, 0.0);
}

// Recomputing N of a stage's layers costs N / (L / pp) of the forward again
// and keeps that share of the layers at their inputs only.
TEST(Planner, PartialRecomputeCostsItsShareOfTheForward) {
  const auto c = preset("gpt2-124m");  // 12 layers
  PlanOptions o = one_batch(2, 512, "bf16");
  o.layout.devices_per_node = 1;
  o.layout.recompute = true;
  auto recompute_s = [&](int64_t layers) {
    o.layout.recompute_layers = layers;
    for (const auto& part : predict_step(c, gpu_node(), o).compute)
      if (part.kind == "recompute") return part.seconds;
    return 0.0;
  };
  const double all = recompute_s(0);
  EXPECT_GT(all, 0);
  EXPECT_NEAR(recompute_s(3), all * 3 / 12, 1e-12);
  EXPECT_NEAR(recompute_s(12), all, 1e-12);
  EXPECT_NEAR(recompute_s(40), all, 1e-12);
  o.layout.recompute_layers = 3;
  EXPECT_DOUBLE_EQ(recompute_share(c, o.layout), 0.25);
  const MemoryPerRank m = memory_per_rank(c, o.layout);
  EXPECT_NEAR(m.activations, 0.25 * m.activations_recompute + 0.75 * m.activations_no_recompute,
              1e-6 * m.activations);
  o.layout.recompute = false;
  EXPECT_EQ(recompute_share(c, o.layout), 0);
}

// Stages that the layers do not divide evenly: every figure is the
// largest stage's (the step runs at the slowest stage's pace, the first
// stage holds the most activations), and an even split is 1/pp exactly.
TEST(Planner, UnevenPipelineStagesArePricedAtTheLargest) {
  auto c = preset("gpt2-124m");
  Layout l;
  l.devices_per_node = 4;
  l.pp = 4;
  l.seq = 512;
  l.global_batch = 8;
  EXPECT_EQ(stage_layers(c, l), 3);  // 12 layers: 3 each
  l.vp = 2;                          // 8 chunks of 1 or 2: stages 0..3 get 2+1
  EXPECT_EQ(stage_layers(c, l), 3);
  c.n_layers = 10;
  l.vp = 1;
  EXPECT_EQ(stage_layers(c, l), 3);  // 3, 3, 2, 2
  l.vp = 2;                          // chunks 2, 2, 1, 1, 1, 1, 1, 1
  EXPECT_EQ(stage_layers(c, l), 3);
  c.n_layers = 13;
  l.vp = 3;  // 12 chunks: one of 2, eleven of 1; stage 0 holds 2 + 1 + 1
  EXPECT_EQ(stage_layers(c, l), 4);
  l.pp = 1;
  l.vp = 1;
  EXPECT_EQ(stage_layers(c, l), 13);

  // 10 layers on 4 stages against 12 (3 a stage either way): the same
  // stage's compute and activations, and one of 10 layers' weights each.
  auto even = preset("gpt2-124m");
  auto odd = even;
  odd.n_layers = 10;
  Layout p4;
  p4.devices_per_node = 4;
  p4.pp = 4;
  p4.seq = 512;
  p4.global_batch = 8;
  p4.dtype = "bf16";
  const MemoryPerRank me = memory_per_rank(even, p4), mo = memory_per_rank(odd, p4);
  EXPECT_NEAR(mo.activations, me.activations, 1e-9 * me.activations);
  PlanOptions o;
  o.layout = p4;
  const Prediction pe = predict_step(even, gpu_node(), o);
  const Prediction po = predict_step(odd, gpu_node(), o);
  double attention_e = 0, attention_o = 0;
  for (const auto& part : pe.compute)
    if (part.kind == "attention") attention_e += part.seconds;
  for (const auto& part : po.compute)
    if (part.kind == "attention") attention_o += part.seconds;
  EXPECT_GT(attention_e, 0);
  EXPECT_NEAR(attention_o, attention_e, 1e-9 * attention_e);
  bool said = false;
  for (const auto& a : po.assumptions) said |= a.find("3 of 10 layers") != std::string::npos;
  EXPECT_TRUE(said);
  // Chunks of 2 and 1 layers that still make equal stages (10 layers on 2
  // stages of 3 virtual ones: 5 and 5) are balanced.
  Layout p2 = p4;
  p2.devices_per_node = 2;
  p2.pp = 2;
  p2.vp = 3;
  EXPECT_EQ(stage_layers(odd, p2), 5);
  o.layout = p2;
  bool balanced = false;
  for (const auto& a : predict_step(odd, gpu_node(), o).assumptions)
    balanced |= a.find("pipeline stages balanced") != std::string::npos;
  EXPECT_TRUE(balanced);
}

TEST(Planner, TensorPipelineAndContextParallelSplitTheWork) {
  const auto c = preset("llama-style");  // 12 heads, 4 KV heads, ffn 2048, vocab 50304
  Layout l;
  l.devices_per_node = 8;
  l.nodes = 4;  // 32 ranks = dp 2 x tp 4 x pp 2 x cp 2
  l.tp = 4;
  l.pp = 2;
  l.cp = 2;
  l.seq = 1024;
  l.micro_batch = 1;
  l.global_batch = 16;  // 8 micro-batches per replica
  validate_layout(c, l);
  EXPECT_EQ(l.world(), 32);
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.accumulation(), 8);
  // A tensor-parallel rank's GEMMs: columns of qkv / up, rows of out / down,
  // the vocabulary, on seq / cp tokens.
  std::map<std::string, model::GemmShape> g;
  for (const auto& s : step_gemms(c, l, false)) g[s.shape.name] = s.shape;
  EXPECT_EQ(g["attn.qkv.fwd"].m, 512);
  EXPECT_EQ(g["attn.qkv.fwd"].n, (12 * 64 + 2 * 4 * 64) / 4);
  EXPECT_EQ(g["attn.out.fwd"].k, 12 * 64 / 4);
  EXPECT_EQ(g["mlp.up.fwd"].n, 2 * 2048 / 4);
  EXPECT_EQ(g["mlp.down.fwd"].k, 2048 / 4);
  EXPECT_EQ(g["lm_head.fwd"].n, 50304 / 4);
  // Attention: the rank's heads, half of the causal work.
  Layout one = l;
  one.tp = one.pp = one.cp = 1;
  one.devices_per_node = 1;
  one.nodes = 1;
  one.global_batch = 1;
  EXPECT_NEAR(step_attention(c, l, true).flops * 4 * 2, step_attention(c, one, true).flops, 1);
  // Weights: 1 / (tp x pp) on a rank.
  EXPECT_NEAR(local_params(c, l).total() * 8, local_params(c, one).total(), 1);
  // Collectives: tensor-parallel activations 4 per layer per micro-batch on
  // the stage's 6 layers, context-parallel keys and values, stage p2p.
  std::map<std::string, CommOp> ops;
  for (const auto& op : comm_per_step(c, l)) ops[op.op + " " + op.group] = op;
  EXPECT_EQ(ops["allreduce tp"].calls, 4 * 6 * 8);
  EXPECT_NEAR(ops["allreduce tp"].bytes, 512.0 * 768 * 2, 1e-9);
  EXPECT_EQ(ops["allreduce tp"].ranks_per_node, 4);
  EXPECT_NEAR(ops["allgather cp"].bytes, 1024.0 * 2 * 1 * 64 * 2, 1e-9);  // 4 KV heads / tp 4
  EXPECT_EQ(ops["sendrecv pp"].calls, 2 * 8);
  EXPECT_EQ(ops["sendrecv pp"].ranks_per_node, 1);  // tp x cp fill a node: stages cross nodes
  // Gradients are summed over every rank holding the same weights: 2
  // replicas x 2 context-parallel ranks, two of them on each node.
  EXPECT_EQ(l.replicas(), 4);
  EXPECT_EQ(ops.count("allreduce dp"), 0u);
  EXPECT_EQ(ops["allreduce dp x cp"].ranks, 4);
  EXPECT_EQ(ops["allreduce dp x cp"].ranks_per_node, 2);
  // The pipeline bubble: (pp - 1) / (vp x micro-batches) of the stage's compute.
  PlanOptions o;
  o.layout = l;
  o.layout.dtype = "bf16";
  o.layout.vp = 2;
  const Prediction p = predict_step(c, gpu_node(), o);
  double stage = 0, bubble = 0;
  for (const auto& part : p.compute)
    (part.name == "pipeline bubble" ? bubble : stage) += part.seconds;
  EXPECT_NEAR(bubble, stage * 1.0 / (2 * 8), 1e-12);
  const double achieved = p.model_flops_per_token * p.tokens_per_s;
  EXPECT_NEAR(p.mfu * 1000e3 * 1e9 * 32, achieved, 1e-12 * achieved);
  // Inconsistent layouts name the flag.
  l.tp = 5;
  EXPECT_THROW(validate_layout(c, l), InputError);
  l.tp = 4;
  l.cp = 3;
  EXPECT_THROW(validate_layout(c, l), InputError);
  l.cp = 2;
  // Layouts that cannot exist: more stages than layers, chunks of one token
  // under cp (the trainer's 2 x cp chunks of at least 2), a tensor split
  // that does not divide the MLP, a step's tokens past int64's comfort, a
  // sequence past learned positions.
  const auto refused = [&](Layout bad, const model::ModelConfig& m, const std::string& flag) {
    try {
      validate_layout(m, bad);
      ADD_FAILURE() << "accepted: " << flag;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(flag, 0), 0u) << e.what();
    }
  };
  Layout bad = l;
  bad.pp = 16;     // 12 layers
  bad.nodes = 16;  // 128 ranks: dp 2 x tp 4 x pp 16 x cp 2
  refused(bad, c, "--pp 16");
  bad = l;
  bad.seq = 4 * 2 * 2 + 2;  // not a multiple of 2 x cp
  refused(bad, c, "--cp 2");
  bad.seq = 2;  // chunks of half a token
  refused(bad, c, "--cp 2");
  auto odd_ffn = c;
  odd_ffn.ffn_hidden = 2050;
  refused(l, odd_ffn, "--tp 4");
  bad = l;
  bad.micro_batch = int64_t{1} << 45;
  bad.global_batch = bad.micro_batch * 2;
  refused(bad, c, "--micro-batch");
  auto learned = c;
  learned.position = model::Position::learned;
  bad = l;
  bad.seq = learned.seq_len * 2;
  refused(bad, learned, "--seq");
  l.fsdp = l.zero1 = true;
  EXPECT_THROW(validate_layout(c, l), InputError);
}

// Context parallel memory: 1/cp of the per-token activations plus the
// trainer's own K/V buffers (model::ContextParallel::scratch_bytes, at the
// activation width); ZAYA1's CCA adds its halo rows, two messages per layer
// each way.
TEST(Planner, ContextParallelCountsTheSharedKeyValueBuffersAndTheHalos) {
  const auto c = preset("zaya1-base");
  Layout one;
  one.devices_per_node = 2;
  one.micro_batch = 1;
  one.seq = 4096;
  one.dtype = "f32";
  Layout two = one;
  two.cp = 2;
  one.global_batch = 2;
  two.global_batch = 1;
  validate_layout(c, one);
  validate_layout(c, two);
  const MemoryPerRank m1 = memory_per_rank(c, one), m2 = memory_per_rank(c, two);
  const double kv = static_cast<double>(
      model::ContextParallel::scratch_bytes(1, 4096, 2, 2 * c.n_kv_heads * c.head_dim));
  EXPECT_GT(kv, 0);
  // Halving the tokens halves everything per token; the buffers come on top.
  EXPECT_LT(m2.activations_no_recompute, m1.activations_no_recompute);
  EXPECT_GT(m2.activations_no_recompute - kv, 0.45 * m1.activations_no_recompute);
  EXPECT_LT(m2.activations_no_recompute - kv, 0.55 * m1.activations_no_recompute);
  std::map<std::string, CommOp> ops;
  for (const auto& op : comm_per_step(c, two)) ops[op.op + " " + op.group] = op;
  ASSERT_TRUE(ops.count("sendrecv cp"));
  EXPECT_EQ(ops["sendrecv cp"].calls, 2 * c.n_layers);
  EXPECT_NEAR(ops["sendrecv cp"].bytes,
              2.0 * (2 * (c.n_heads + c.n_kv_heads) + 1) * c.head_dim * 4, 1e-9);
  for (const auto& op : comm_per_step(c, one)) EXPECT_NE(op.group, "cp");
  // The two context-parallel ranks hold the same weights: their gradients
  // are summed (there is no other replica), and ZeRO-1 shards the optimizer
  // state over both.
  ASSERT_TRUE(ops.count("allreduce dp x cp"));
  EXPECT_EQ(ops["allreduce dp x cp"].ranks, 2);
  EXPECT_NEAR(ops["allreduce dp x cp"].bytes, local_params(c, two).total() * 4.0, 1e-6);
  Layout sharded = two;
  sharded.zero1 = true;
  EXPECT_NEAR(memory_per_rank(c, sharded).optimizer * 2, memory_per_rank(c, two).optimizer, 1e-6);
}

TEST(Planner, FsdpShardsWeightsAndGathersThemPerMicroBatch) {
  const auto c = preset("gpt2-124m");
  Layout l;
  l.devices_per_node = 8;
  l.micro_batch = 1;
  l.seq = 1024;
  l.global_batch = 16;  // 2 micro-batches per rank
  const MemoryPerRank plain = memory_per_rank(c, l);
  l.fsdp = true;
  const MemoryPerRank fsdp = memory_per_rank(c, l);
  EXPECT_NEAR(fsdp.weights * 8, plain.weights, 1);
  EXPECT_NEAR(fsdp.gradients * 8, plain.gradients, 1);
  EXPECT_NEAR(fsdp.optimizer * 8, plain.optimizer, 1);
  const auto ops = comm_per_step(c, l);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].op, "allgather");
  EXPECT_EQ(ops[0].calls, 4);  // forward and backward of 2 micro-batches
  EXPECT_EQ(ops[1].op, "reduce_scatter");
}

// A CPU's ranks share it: each computes and streams memory at its share of
// the profile's whole-CPU rates, so two ranks on one node take twice the
// single-rank compute time for the same per-rank micro-batch.
TEST(Planner, CpuRanksGetTheirShareOfTheProcessor) {
  HwProfile cpu = cpu_node();
  cpu.attention = {{"f32", 64, 64, 15}};
  cpu.comm["ranks"]["2"]["allreduce"]["shm"] = {{"alpha_us", 10.0}, {"bandwidth_gbs", 2.0}};
  cpu.comm["ranks"]["2"]["reduce_scatter"]["shm"] = {{"alpha_us", 10.0}, {"bandwidth_gbs", 2.0}};
  cpu.comm["ranks"]["2"]["allgather"]["shm"] = {{"alpha_us", 10.0}, {"bandwidth_gbs", 2.0}};
  EXPECT_EQ(cpu_threads(cpu), 2);
  Layout one;
  one.dtype = "f32";
  one.micro_batch = 2;
  one.seq = 64;
  one.global_batch = 2;
  Layout two = one;
  two.devices_per_node = 2;
  two.global_batch = 4;
  EXPECT_DOUBLE_EQ(cpu_rank_share(cpu, one), 1.0);
  EXPECT_DOUBLE_EQ(cpu_rank_share(cpu, two), 0.5);
  Layout pinned = two;
  pinned.threads_per_rank = 2;
  EXPECT_DOUBLE_EQ(cpu_rank_share(cpu, pinned), 1.0);
  EXPECT_DOUBLE_EQ(cpu_rank_share(gpu_node(), two), 1.0);
  const HwProfile half = cpu_rank_view(cpu, 0.5);
  EXPECT_DOUBLE_EQ(half.peak_gflops("f32"), 75);
  EXPECT_DOUBLE_EQ(half.memory_levels[0].gbs, 15);
  EXPECT_DOUBLE_EQ(half.attention[0].gflops, 7.5);

  const auto c = preset("gpt2-124m");
  PlanOptions a, b;
  a.layout = one;
  b.layout = two;
  const Prediction p1 = predict_step(c, cpu, a), p2 = predict_step(c, cpu, b);
  EXPECT_NEAR(p2.compute_s / p1.compute_s, 2.0, 1e-9);
  EXPECT_NEAR(p2.optimizer_s / p1.optimizer_s, 2.0, 1e-9);
  // The gradient all-reduce from the measured 2-rank fit: alpha + bytes / bandwidth.
  const double grad_bytes = static_cast<double>(model::count_parameters(c).total()) * 4;
  EXPECT_NEAR(p2.comm_s, 10e-6 + grad_bytes / 2e9, 1e-9);
  // The same two ranks on two nodes: the one-node fit does not apply; the
  // link prices it (one ring step each way: bytes / link at 0.8 + alpha).
  cpu.interconnect.nic_gbps = 8;
  cpu.interconnect.nics_per_node = 1;
  const CommPrice across = price_collective(cpu, "allreduce", 2, 1, 1e9);
  EXPECT_NEAR(across.seconds, 2 * (0.5e9 / 0.8e9 + kInterNodeAlphaUs * 1e-6), 1e-12);
  EXPECT_NE(across.how.find("2 nodes"), std::string::npos) << across.how;
  EXPECT_THROW(price_collective(gpu_node(), "allreduce", 2, 2, 1e6, "shm"), InputError);
}

// A run's attention is priced at the profile's points of its dtype (the
// bf16 tiles for a bf16 run), at any dtype's where it has none of its own.
TEST(Planner, AttentionTakesTheRateOfTheRunsDtype) {
  HwProfile cpu = cpu_node();
  cpu.peak.push_back({"bf16", 2, 300});
  cpu.attention = {{"f32", 64, 64, 15}};
  const auto c = preset("gpt2-124m");
  auto attention_s = [&](const std::string& dtype) {
    PlanOptions o;
    o.layout.dtype = dtype;
    o.layout.micro_batch = 2;
    o.layout.seq = 64;
    o.layout.global_batch = 2;
    for (const StepPart& part : predict_step(c, cpu, o).compute)
      if (part.kind == "attention") return part.seconds;
    ADD_FAILURE() << "no attention part";
    return 0.0;
  };
  const double f32 = attention_s("f32");
  EXPECT_DOUBLE_EQ(attention_s("bf16"), f32);  // no bf16 points: the f32 rate
  cpu.attention.push_back({"bf16", 64, 64, 30});
  EXPECT_DOUBLE_EQ(attention_s("f32"), f32);
  EXPECT_NEAR(attention_s("bf16"), f32 / 2, 1e-12 * f32);
}

TEST(Planner, InconsistentLayoutsAndUnknownHardwareAreInputErrors) {
  const auto c = preset("gpt2-124m");
  Layout l;
  l.devices_per_node = 8;
  l.global_batch = 12;  // not a multiple of 8 ranks x micro-batch 1
  EXPECT_THROW(validate_layout(c, l), InputError);
  l.global_batch = 8;
  l.ep = 2;  // dense config
  EXPECT_THROW(validate_layout(c, l), InputError);
  ::setenv("ANVIL_PROFILES", (kSource + "/profiles").c_str(), 1);
  try {
    find_hw_profile("tpu-v9", "--hw");
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--hw"), std::string::npos) << what;
    EXPECT_NE(what.find("tpu-v9"), std::string::npos) << what;
    EXPECT_NE(what.find("mi300x"), std::string::npos) << what;
  }
  EXPECT_EQ(find_hw_profile("mi300x", "--hw").compute_units, 304);
}

}  // namespace
}  // namespace anvil::plan
