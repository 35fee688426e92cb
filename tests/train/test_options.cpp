// The trainer's options, declared once: checks that name the key and what
// it must be, JSON out and back in (a run's train.json), unknown keys and
// wrong types refused, rules between options, and the MFU peak's sources.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/train/gemm_peak.hpp"
#include "anvil/train/options.hpp"
#include "support/input_error.hpp"

namespace anvil::train {
namespace {

using test_support::expect_input_error;

TEST(TrainOptions, ChecksNameTheKeyAndWhatTheValueMustBe) {
  TrainOptions o;
  o.train.batch = 0;
  expect_input_error([&] { o.finish(); }, {"train.batch: must be >= 1, got 0"});
  o = TrainOptions();
  o.train.val_fraction = 0.7;
  expect_input_error([&] { o.finish(); }, {"train.val_fraction: must be in [0, 0.5], got 0.7"});
  o = TrainOptions();
  o.optimizer.name = "sgd";
  expect_input_error([&] { o.finish(); }, {"optimizer.name: must be adamw or muon, got sgd"});
  o = TrainOptions();
  o.model.dtype = "fp8";
  expect_input_error([&] { o.finish(); }, {"model.dtype: expected one of fp32, bf16, got 'fp8'"});
  o = TrainOptions();
  o.checkpoint.resume = "latest";
  expect_input_error([&] { o.finish(); }, {"checkpoint.resume: 'latest' needs checkpoint.out"});
  o = TrainOptions();
  o.optimizer.muon.ns_bf16 = true;
  expect_input_error([&] { o.finish(); },
                     {"optimizer.muon_bf16: needs optimizer.name muon, got adamw"});
  o = TrainOptions();
  o.faults.inject = "boom@3";
  expect_input_error([&] { o.finish(); }, {"faults.inject: ", "got 'boom@3'"});
}

TEST(TrainOptions, FinishingSpellsTheDtypeOneWayAndFillsTheScheduleLength) {
  TrainOptions o;
  o.model.dtype = "bfloat16";
  o.train.steps = 42;
  o.finish();
  EXPECT_EQ(o.model.dtype, "bf16");
  EXPECT_EQ(o.optimizer.schedule.total, 42);
  o.optimizer.schedule.total = 7;  // set (a recipe phase): kept
  o.finish();
  EXPECT_EQ(o.optimizer.schedule.total, 7);
}

TEST(TrainOptions, JsonOutAndBackGivesTheSameOptions) {
  TrainOptions o;
  o.train.batch = 3;
  o.model.set = {"d_model=64", "n_layers=2"};
  o.optimizer.schedule.lr = 1.5e-3;
  o.optimizer.adamw.beta2 = 0.99f;
  o.parallel.zero = true;
  o.balancing.skip_target = 0.25f;
  o.phase.name = "anneal";
  const nlohmann::json j = o.to_json();
  EXPECT_EQ(j.at("train").at("batch"), 3);
  EXPECT_EQ(j.at("checkpoint").at("every"), 0);
  TrainOptions back;
  back.update_from_json(j, "run.json");
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.model.set, o.model.set);
  EXPECT_EQ(back.optimizer.adamw.beta2, 0.99f);
}

TEST(TrainOptions, RunFilesRefuseUnknownKeysAndWrongTypes) {
  TrainOptions o;
  expect_input_error(
      [&] {
        o.update_from_json({{"train", {{"batchsize", 4}}}}, "run.json");
      },
      {"run.json: unknown option 'train.batchsize'"});
  expect_input_error(
      [&] {
        o.update_from_json({{"trainer", {{"batch", 4}}}}, "run.json");
      },
      {"run.json: unknown option 'trainer.batch'"});
  expect_input_error(
      [&] {
        o.update_from_json({{"train", {{"batch", "four"}}}}, "run.json");
      },
      {"run.json: train.batch: expected a value like 4, got \"four\""});
  // A number that no integer option's type holds (a float, out of range, or
  // negative for an unsigned) is refused, never cast.
  for (const auto& [key, bad] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"seed", 1.26667e33}, {"seed", -1}, {"batch", 2.5}, {"batch", 18446744073709551615u},
           {"threads", int64_t{1} << 40}, {"threads", -(int64_t{1} << 40)}}) {
    expect_input_error([&] { o.update_from_json({{"train", {{key, bad}}}}, "run.json"); },
                       {"run.json: train." + key + ": expected a value like", bad.dump()});
  }
  o.update_from_json({{"train", {{"seed", 18446744073709551615u}, {"val_fraction", 1}}}},
                     "run.json");
  EXPECT_EQ(o.train.seed, 18446744073709551615u);
  EXPECT_EQ(o.train.val_fraction, 1.0);
  const std::string file = testing::TempDir() + "/options_not_json.json";
  write_file_atomic(file, "{\"train\": ");
  expect_input_error([&] { load_train_options(file); }, {file + ": not valid JSON"});
}

TEST(TrainOptions, TheRecordOfARunHasAbsolutePathsAndNeitherResumeNorFault) {
  TrainOptions o;
  o.model.config = "configs/x.json";
  o.train.data = "a.tok:0.75,b.tok:0.25";
  o.checkpoint.out = "runs/x";
  o.checkpoint.resume = "latest";
  o.faults.inject = "kill@3";
  const TrainOptions r = repeatable(o);
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(r.model.config, cwd + "/configs/x.json");
  EXPECT_EQ(r.train.data, cwd + "/a.tok:0.75," + cwd + "/b.tok:0.25");
  EXPECT_EQ(r.checkpoint.out, cwd + "/runs/x");
  EXPECT_EQ(r.checkpoint.resume, "");
  EXPECT_EQ(r.faults.inject, "");
}

TEST(TrainOptions, ARepeatWithOtherStepsStretchesAScheduleThatSpannedTheRun) {
  TrainOptions o;
  o.train.steps = 4;
  o.finish();
  ASSERT_EQ(o.optimizer.schedule.total, 4);
  TrainOptions again;
  again.update_from_json(repeatable(o).to_json(), "train.json");
  again.train.steps = 2;  // --steps 2 after --train
  again.finish();
  EXPECT_EQ(again.optimizer.schedule.total, 2);
  // A schedule set apart from the steps is kept.
  o.optimizer.schedule.total = 10;
  EXPECT_EQ(repeatable(o).optimizer.schedule.total, 10);
}

TEST(GemmPeak, AGivenRateAProfileOrACachedMeasurement) {
  EXPECT_EQ(gemm_peak(123.0, "", model::Precision::fp32).gflops, 123.0);
  // A profile's measured peak at this thread count.
  plan::HwProfile p =
      plan::load_hw_profile(std::string(ANVIL_SOURCE_DIR) + "/profiles/h100-sxm.json");
  p.peak = {{"f32", num_threads(), 77.0}, {"bf16", num_threads(), 150.0}};
  const std::string file = testing::TempDir() + "/gemm_peak_profile.json";
  plan::save_hw_profile(p, file);
  const GemmPeak from_profile = gemm_peak(0, file, model::Precision::bf16);
  EXPECT_EQ(from_profile.gflops, 150.0);
  EXPECT_NE(from_profile.source.find(file), std::string::npos) << from_profile.source;
  p.peak = {{"f32", num_threads() + 1, 77.0}};
  plan::save_hw_profile(p, file);
  expect_input_error([&] { gemm_peak(0, file, model::Precision::fp32); },
                     {"metrics.hw_profile: " + file, "no f32 GEMM peak"});
  // The cache, read; an entry a run beat is dropped, and the next call measures.
  const std::string cache = testing::TempDir() + "/gemm_peak_cache";
  std::filesystem::remove_all(cache);
  std::filesystem::create_directories(cache);
  ::setenv("ANVIL_CACHE_DIR", cache.c_str(), 1);
  const nlohmann::json entry = {{"gflops", 99.0}, {"date", "2026-01-02"}};
  write_file_atomic(cache + "/gemm-peak.json",
                    nlohmann::json{{gemm_peak_cache_key(model::Precision::fp32), entry}}.dump());
  const GemmPeak cached = gemm_peak(0, "", model::Precision::fp32);
  EXPECT_EQ(cached.gflops, 99.0);
  EXPECT_TRUE(cached.cached);
  EXPECT_NE(cached.source.find("measured 2026-01-02"), std::string::npos) << cached.source;
  forget_cached_peak(model::Precision::fp32);
  const GemmPeak measured = gemm_peak(0, "", model::Precision::fp32);
  EXPECT_FALSE(measured.cached);
  EXPECT_GT(measured.gflops, 0);
  EXPECT_NE(measured.source.find("measured now"), std::string::npos) << measured.source;
  ::unsetenv("ANVIL_CACHE_DIR");
}

}  // namespace
}  // namespace anvil::train
