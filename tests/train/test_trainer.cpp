// The trainer's contracts: same seed -> the same losses; 2N steps equal N
// steps + resume + N steps bit for bit; checkpoints keep the newest K; bad
// resumes are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/data/tokens.hpp"
#include "anvil/ft/faults.hpp"
#include "anvil/model/family.hpp"
#include "anvil/parallel/distributed_optimizer.hpp"
#include "anvil/train/trainer.hpp"
#include "support/input_error.hpp"

namespace anvil::train {
namespace {

namespace fs = std::filesystem;

TrainOptions tiny(const std::string& run_dir) {
  static const std::string text_path = [] {
    std::string text;
    for (int i = 0; i < 400; ++i) {
      text +=
          "In the beginning the engine computed line " + std::to_string(i * 7919 % 1000) + ".\n";
    }
    const std::string p = testing::TempDir() + "/trainer_corpus.txt";
    write_file_atomic(p, text);
    return p;
  }();
  TrainOptions o;
  o.model.config = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/llama-tiny.json";
  o.model.set = {"vocab_size=256"};
  o.train.data = text_path;
  o.train.batch = 2;
  o.train.seq = 32;
  o.train.accum = 2;
  o.train.steps = 8;
  o.optimizer.schedule.lr = 3e-3;
  o.optimizer.schedule.warmup = 2;
  o.optimizer.schedule.total = 8;
  o.checkpoint.out = run_dir;
  o.metrics.peak_gflops = 1;  // do not measure
  o.metrics.quiet = true;
  o.train.val_batches = 2;
  return o;
}

// tiny(run_dir) resuming from its newest checkpoint.
TrainOptions resumed(const std::string& run_dir) {
  TrainOptions o = tiny(run_dir);
  o.checkpoint.resume = "latest";
  return o;
}

using test_support::expect_input_error;

// Every file under `dir` with its contents: equal snapshots, nothing written
// or deleted.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    files[rel] = e.is_regular_file() ? read_file(e.path().string()) : "<dir>";
  }
  return files;
}

std::vector<int64_t> metric_steps(const std::string& path) {
  std::vector<int64_t> steps;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  }
  return steps;
}

// Runs `o` for `first_steps` into a fresh `dir`, then resumes it to o.train.steps;
// returns the losses of both halves joined.
std::vector<double> run_in_two_halves(const TrainOptions& o, const std::string& dir,
                                      int64_t first_steps) {
  fs::remove_all(dir);
  auto first = o;
  first.checkpoint.out = dir;
  first.train.steps = first_steps;
  auto joined = run_training(first).losses;
  auto second = o;
  second.checkpoint.out = dir;
  second.checkpoint.resume = "latest";
  const auto rest = run_training(second);
  EXPECT_EQ(rest.first_step, first_steps);
  joined.insert(joined.end(), rest.losses.begin(), rest.losses.end());
  return joined;
}

TEST(Trainer, SameSeedGivesIdenticalLossesAndLossGoesDown) {
  const auto a = run_training(tiny(""));
  const auto b = run_training(tiny(""));
  ASSERT_EQ(a.losses.size(), 8u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_LT(a.losses.back(), a.losses.front());
  EXPECT_GT(a.val_loss, 0);
}

TEST(Trainer, Bf16MatmulsTrainCloseToFp32AndResumeExactly) {
  auto o = tiny("");
  const auto fp32 = run_training(o);
  o.model.dtype = "bf16";
  const auto bf16 = run_training(o);
  ASSERT_EQ(bf16.losses.size(), fp32.losses.size());
  for (size_t i = 0; i < fp32.losses.size(); ++i) EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 0.05);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front());
  // Resume in bf16 is exact too: the bf16 copy is rebuilt from the fp32 masters.
  const std::string dir = testing::TempDir() + "/resume_bf16";
  const auto joined = run_in_two_halves(o, dir, 5);
  EXPECT_EQ(joined, bf16.losses);
  auto mismatched = o;
  mismatched.checkpoint.out = dir;
  mismatched.checkpoint.resume = "latest";
  mismatched.model.dtype = "fp32";
  EXPECT_THROW(run_training(mismatched), InputError);
}

// --weight-decay is Muon's too: with zero gradients a step leaves every
// weight as it was at decay 0, and at 0.5 shrinks the decayed ones, the
// Muon matrices among them.
TEST(Trainer, WeightDecayAppliesToMuonsMatricesToo) {
  const model::ModelConfig c =
      model::load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
  for (const float decay : {0.0f, 0.5f}) {
    auto model = model::model_family(c).make_model(c, {});
    const model::ParamRegistry& r = model->registry();
    r.initialize(model->params(), 5);
    const std::vector<float> before(model->params(), model->params() + r.total());
    std::fill(model->grads(), model->grads() + r.total(), 0.0f);
    optim::OptimizerOptions o;
    o.name = "muon";
    o.adamw.weight_decay = decay;
    parallel::DistributedOptimizer opt(*model, o, {}, nullptr);
    opt.update(0.1f, 1.0f, 1);
    const float* after = model->params();
    int muon = 0;
    for (const auto& s : r.specs()) {
      const bool decays = decay > 0 && s.weight_decay;
      muon += decays && s.group == model::OptimizerGroup::muon;
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const auto k = static_cast<size_t>(i);
        if (decays && before[k] != 0.0f) {
          EXPECT_LT(std::fabs(after[k]), std::fabs(before[k])) << s.name;
        } else if (!decays) {
          EXPECT_EQ(after[k], before[k]) << s.name;
        }
      }
    }
    if (decay > 0) {
      EXPECT_GT(muon, 0);
    }
  }
}

TEST(Trainer, MuonTrainsAndResumesExactly) {
  auto o = tiny("");
  o.optimizer.name = "muon";
  const auto whole = run_training(o);
  EXPECT_LT(whole.losses.back(), whole.losses.front());
  EXPECT_NE(whole.losses, run_training(tiny("")).losses);  // not AdamW's trajectory
  const std::string dir = testing::TempDir() + "/resume_muon";
  const auto joined = run_in_two_halves(o, dir, 3);
  EXPECT_EQ(joined, whole.losses);  // momentum buffers are in the checkpoint
  auto adamw = resumed(dir);
  EXPECT_THROW(run_training(adamw), InputError);
  auto bad = tiny("");
  bad.optimizer.name = "sgd";
  EXPECT_THROW(run_training(bad), InputError);
}

// zaya-tiny, 10 steps of 4 rows.
TrainOptions zaya_tiny() {
  auto o = tiny("");
  o.model.config = ANVIL_SOURCE_DIR "/configs/zaya-tiny.json";
  o.train.batch = 4;
  o.train.accum = 1;
  o.train.steps = 10;
  return o;
}

TEST(Trainer, Zaya1TrainsBalancesAndResumesExactlyWithItsBiases) {
  auto o = zaya_tiny();
  o.balancing.lr = 0.05f;
  const auto whole = run_training(o);
  EXPECT_LT(whole.losses.back(), whole.losses.front());
  const std::string dir = testing::TempDir() + "/resume_zaya";
  const auto joined = run_in_two_halves(o, dir, 4);
  EXPECT_EQ(joined, whole.losses);  // balancing biases and their Adam state are checkpointed
  const auto w = ckpt::read_tensors(dir + "/step-00000010", "model");
  EXPECT_EQ(w.count("model.layers.1.zaya_block.router.balancing_biases"), 1u);
  auto bad = o;
  bad.balancing.mode = "magic";
  EXPECT_THROW(run_training(bad), InputError);
}

// A loss spike's step is skipped whole: its expert loads never reach the
// balancer (added to the next step's, they would skew its bias update), so a run resumed
// from the skipped step's checkpoint goes on with the straight run's losses.
TEST(Trainer, ASkippedSpikeStepLeavesNoExpertLoadsToTheNextStep) {
  auto o = zaya_tiny();
  o.balancing.lr = 0.05f;
  o.guard.spike_z = 3;
  o.guard.spike_window = 3;
  o.faults.inject = "spike@6";  // step 6's loss x 10
  const std::string dir = testing::TempDir() + "/spike_zaya";
  fs::remove_all(dir);
  auto straight = o;
  straight.checkpoint.out = dir + "/straight";
  straight.checkpoint.every = 1;
  straight.checkpoint.keep = 0;  // all
  const auto whole = run_training(straight);
  int64_t skipped = 0;  // the first skipped step with steps after it
  std::ifstream metrics(dir + "/straight/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto m = nlohmann::json::parse(line);
    if (m.value("skipped", false) && m["step"].get<int64_t>() < o.train.steps) {
      skipped = m["step"].get<int64_t>();
      break;
    }
  }
  ASSERT_GT(skipped, 0) << "no step was skipped";
  auto rest = o;
  rest.checkpoint.out = dir + "/rest";
  rest.checkpoint.resume = dir + "/straight/" + ckpt::checkpoint_name(skipped);
  const auto after = run_training(rest);
  ASSERT_EQ(after.first_step, skipped);
  EXPECT_EQ(after.losses, std::vector<double>(whole.losses.begin() + skipped, whole.losses.end()));
  // Each later step's expert loads (what the balancer reads) and biases too.
  const auto routers = [&](const std::string& run) {
    std::map<int64_t, nlohmann::json> by_step;
    std::ifstream f(dir + run + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto m = nlohmann::json::parse(line);
      if (m["step"].get<int64_t>() > skipped) by_step[m["step"].get<int64_t>()] = m["router"];
    }
    return by_step;
  };
  const auto straight_routers = routers("/straight");
  ASSERT_EQ(straight_routers.size(), static_cast<size_t>(o.train.steps - skipped));
  EXPECT_EQ(straight_routers, routers("/rest"));
}

// --precision bf16 for ZAYA1: the CCA projections and experts on bf16 copies
// (fp32 masters, accumulation and gradients) stay close to the fp32 run, the
// copy is rebuilt from the masters on resume (the same losses), and the
// memory plan counts it.
TEST(Trainer, Zaya1InBf16TrainsCloseToFp32AndResumesExactly) {
  auto o = zaya_tiny();
  const auto fp32 = run_training(o);
  o.model.dtype = "bf16";
  const auto bf16 = run_training(o);
  ASSERT_EQ(bf16.losses.size(), fp32.losses.size());
  double largest = 0;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    const double d = std::abs(bf16.losses[i] - fp32.losses[i]);
    EXPECT_LT(d, 2e-3 * fp32.losses[i]) << "step " << i + 1;
    largest = std::max(largest, d);
  }
  EXPECT_GT(largest, 0.0);  // it did multiply in bf16
  EXPECT_GT(bf16.planned_bytes, fp32.planned_bytes);
  const auto joined = run_in_two_halves(o, testing::TempDir() + "/resume_zaya_bf16", 4);
  EXPECT_EQ(joined, bf16.losses);
}

// Each step's record says where its time went: the GEMMs, attention and
// experts inside forward and backward, the rest of the layer work, and the
// optimizer, together no more than the step; the run's JSON has their medians.
TEST(Trainer, StepRecordsSplitTheStepIntoItsParts) {
  const std::string dir = testing::TempDir() + "/step_parts";
  fs::remove_all(dir);
  auto o = zaya_tiny();
  o.checkpoint.out = dir;
  o.train.steps = 3;
  const auto r = run_training(o);
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  int records = 0;
  while (std::getline(in, line)) {
    const auto m = nlohmann::json::parse(line);
    ASSERT_TRUE(m.contains("parts_s")) << line;
    double sum = 0;
    for (const char* part : {"gemm", "attention", "experts", "other", "optimizer"}) {
      const double v = m["parts_s"].at(part).get<double>();
      EXPECT_GE(v, 0.0) << part;
      sum += v;
    }
    EXPECT_GT(m["parts_s"]["gemm"].get<double>(), 0.0);
    EXPECT_GT(m["parts_s"]["attention"].get<double>(), 0.0);
    EXPECT_GT(m["parts_s"]["experts"].get<double>(), 0.0);
    EXPECT_LE(sum, m["seconds"].get<double>() * (1 + 1e-9));
    ++records;
  }
  EXPECT_EQ(records, 3);
  for (const char* part : {"gemm", "attention", "experts", "other", "optimizer"})
    EXPECT_TRUE(r.part_seconds.contains(part)) << part;
}

TEST(Trainer, ResumeContinuesTheExactTrajectory) {
  const auto whole = run_training(tiny(""));
  // 4 steps, then a resume for the other 4 (the schedule spans all 8 in both).
  const auto joined = run_in_two_halves(tiny(""), testing::TempDir() + "/resume_run", 4);
  EXPECT_EQ(joined, whole.losses);  // bit-identical
}

TEST(Trainer, KeepsTheNewestCheckpointsAndRefusesMismatchedResumes) {
  const std::string dir = testing::TempDir() + "/keep_run";
  fs::remove_all(dir);
  auto o = tiny(dir);
  o.checkpoint.every = 2;
  o.checkpoint.keep = 2;
  run_training(o);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"metrics.jsonl", "step-00000006", "step-00000008",
                                            "train.json"}));
  EXPECT_EQ(ckpt::resolve_checkpoint(dir), dir + "/step-00000008");

  auto other_shape = resumed(dir);
  other_shape.model.set.push_back("ffn_hidden=96");
  EXPECT_THROW(run_training(other_shape), InputError);
  auto other_batch = resumed(dir);
  other_batch.train.batch = 3;
  EXPECT_THROW(run_training(other_batch), InputError);
  auto nothing = tiny(dir);
  nothing.checkpoint.resume = testing::TempDir() + "/no_such_run";
  EXPECT_THROW(run_training(nothing), InputError);
}

TEST(Trainer, ResumesWithANewAccumOnlyWhenAsked) {
  const std::string dir = testing::TempDir() + "/ramp_run";
  fs::remove_all(dir);
  auto first = tiny(dir);
  first.train.steps = 4;
  run_training(first);
  auto ramp = resumed(dir);
  ramp.train.accum = 3;
  ramp.train.steps = 6;
  EXPECT_THROW(run_training(ramp), InputError);
  ramp.checkpoint.resume_new_accum = true;
  const auto r = run_training(ramp);
  EXPECT_EQ(r.first_step, 4);
  ASSERT_EQ(r.losses.size(), 2u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  // Its checkpoint records the new accum: a plain resume at accum 3 follows.
  const auto state = nlohmann::json::parse(ckpt::read_state_json(ckpt::resolve_checkpoint(dir)));
  EXPECT_EQ(state.at("accum").get<int64_t>(), 3);
  auto plain = resumed(dir);
  plain.train.accum = 3;
  EXPECT_EQ(run_training(plain).first_step, 6);
}

// The same rows per step split another way (a smaller micro-batch, more
// accumulation: what an elastic restart on fewer ranks does) continues the
// trajectory: the losses are the uninterrupted run's up to rounding.
TEST(Trainer, ResumesTheSameRowsPerStepSplitAnotherWay) {
  const std::string dir = testing::TempDir() + "/split_run";
  fs::remove_all(dir);
  auto straight = tiny("");
  straight.train.steps = 8;
  const auto want = run_training(straight).losses;
  auto first = tiny(dir);
  first.train.steps = 4;
  run_training(first);
  auto split = resumed(dir);
  split.train.steps = 8;
  split.train.batch = 1;  // 2 x 2 rows per step before, 1 x 4 now
  split.train.accum = 4;
  const auto r = run_training(split);
  EXPECT_EQ(r.first_step, 4);
  ASSERT_EQ(r.losses.size(), 4u);
  for (size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_NEAR(r.losses[i], want[4 + i], 1e-6 * want[4 + i]) << "step " << 5 + i;
  // Another count of rows per step is a ramp: refused without being asked.
  auto other = resumed(dir);
  other.train.steps = 10;
  other.train.batch = 1;  // 1 x 2
  EXPECT_THROW(run_training(other), InputError);
}

TEST(Trainer, PruningAfterAResumeFromAnOlderStepKeepsTheNewCheckpoint) {
  const std::string dir = testing::TempDir() + "/prune_run";
  fs::remove_all(dir);
  auto o = tiny(dir);
  o.checkpoint.every = 2;
  run_training(o);  // step-4, -6, -8 (keep 3)
  auto again = tiny(dir);
  again.checkpoint.resume = dir + "/step-00000004";
  again.train.steps = 5;
  again.checkpoint.keep = 2;
  const auto r = run_training(again);
  EXPECT_EQ(r.last_checkpoint, dir + "/step-00000005");
  // The newest 2 by step (6, 8) and the one just written; by name the new
  // step-5 sorted among the oldest and went.
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) steps.push_back(e.path().filename().string());
  }
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<std::string>{"step-00000005", "step-00000006", "step-00000008"}));
  // Steps past 8 digits sort by number, not by name.
  const std::string wide = testing::TempDir() + "/prune_wide";
  fs::remove_all(wide);
  fs::create_directories(wide + "/step-99999999");
  fs::create_directories(wide + "/step-100000000");
  fs::create_directories(wide + "/step-notanumber");
  EXPECT_EQ(ckpt::resolve_checkpoint(wide), wide + "/step-100000000");
}

TEST(Trainer, ResumeTruncatesMetricsToTheResumedStepAndKeepsTheOldFile) {
  const std::string dir = testing::TempDir() + "/metrics_run";
  fs::remove_all(dir);
  auto o = tiny(dir);
  o.checkpoint.every = 2;
  o.checkpoint.keep = 0;  // all
  run_training(o);
  const std::string metrics = dir + "/metrics.jsonl";
  const std::string first = read_file(metrics);
  ASSERT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Continuing from the end appends: nothing to drop, nothing rotated.
  auto more = resumed(dir);
  more.train.steps = 9;
  more.optimizer.schedule.total = 9;
  more.checkpoint.keep = 0;
  run_training(more);
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_FALSE(fs::exists(metrics + ".1"));
  const std::string nine = read_file(metrics);
  // From step 4 again: each step once, the first 4 lines as they were, and
  // the whole previous file kept as metrics.jsonl.1.
  auto back = tiny(dir);
  back.checkpoint.resume = dir + "/step-00000004";
  back.checkpoint.keep = 0;
  run_training(back);
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  size_t four_lines = 0;
  for (int i = 0; i < 4; ++i) four_lines = first.find('\n', four_lines) + 1;
  EXPECT_EQ(read_file(metrics).substr(0, four_lines), first.substr(0, four_lines));
  EXPECT_EQ(read_file(metrics + ".1"), nine);
  // A line cut by a crash goes too; the next rotation takes the next number.
  write_file_atomic(metrics, read_file(metrics) + "{\"step\": 9, \"lo");
  const std::string cut = read_file(metrics);
  auto from8 = tiny(dir);
  from8.checkpoint.resume = dir + "/step-00000008";
  from8.train.steps = 9;
  from8.optimizer.schedule.total = 9;
  run_training(from8);
  EXPECT_EQ(metric_steps(metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(read_file(metrics + ".2"), cut);
}

TEST(Trainer, BadTokenFilesAndStateJsonAreOneLineErrorsThatWriteNothing) {
  const std::string dir = testing::TempDir() + "/bad_inputs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A token file whose id 300 at position 41 is past its vocabulary of 256.
  std::vector<int32_t> ids(2000, 3);
  ids[41] = 300;
  data::write_token_file(dir + "/bad.tok", ids, 256);
  auto o = tiny(dir + "/run_bad_tok");
  o.train.data = dir + "/bad.tok";
  expect_input_error([&] { run_training(o); },
                     {dir + "/bad.tok: ", "token 300 at position 41", "[0, 256)"});
  EXPECT_FALSE(fs::exists(dir + "/run_bad_tok"));
  // Its header's vocabulary past the model's.
  ids[41] = 3;
  data::write_token_file(dir + "/wide.tok", ids, 512);
  o.train.data = dir + "/wide.tok";
  expect_input_error([&] { run_training(o); },
                     {dir + "/wide.tok: vocabulary 512 exceeds the model's vocab_size 256"});
  EXPECT_FALSE(fs::exists(dir + "/run_bad_tok"));

  // A checkpoint, then corrupt copies of its state.json.
  const std::string run = dir + "/run";
  auto first = tiny(run);
  first.train.steps = 2;
  run_training(first);
  const std::string state = run + "/step-00000002/state.json";
  const std::string good = read_file(state);
  auto json_state = nlohmann::json::parse(good);
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto s = json_state;
    s[key] = value;
    return s.dump(2);
  };
  auto without = [&](const std::string& key) {
    auto s = json_state;
    s.erase(key);
    return s.dump(2);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {"", "not valid JSON"},
      {"[1, 2]", "expected an anvil-train-state object"},
      {with("format", "something"), "format is \"something\""},
      {with("step", -3), "step is -3 (expected an integer >= 0)"},
      {with("step", "2"), "step is \"2\""},
      {without("step"), "no step (expected an integer >= 0)"},
      {with("config", 7), "config is 7"},
      {with("accum", 0), "accum is 0 (expected an integer >= 1)"},
      {with("seed", 1.5), "seed is 1.5"},
      {with("optimizer", 3), "optimizer is 3 (expected a string)"},
  };
  for (const auto& [text, problem] : cases) {
    write_file_atomic(state, text);
    const auto before = snapshot(run);
    auto resume = resumed(run);
    expect_input_error([&] { run_training(resume); }, {state + ": ", problem});
    EXPECT_EQ(snapshot(run), before) << problem;
  }
  write_file_atomic(state, good);
  auto resume = resumed(run);
  EXPECT_EQ(run_training(resume).first_step, 2);
}

}  // namespace
}  // namespace anvil::train

namespace anvil::train {
namespace {

// A NaN loss ends the run with the roll-back status (the update is never
// applied); losses above the spike threshold skip their update, and
// --max-spikes of them in a row end the run with the other roll-back status.
TEST(Trainer, NonFiniteLossesAndRepeatedSpikesEndTheRunForARollBack) {
  auto o = tiny("");
  o.train.steps = 12;
  o.faults.inject = "nan@5";
  try {
    run_training(o);
    ADD_FAILURE() << "no TrainingFault";
  } catch (const ft::TrainingFault& e) {
    EXPECT_EQ(e.exit_code(), ft::kExitNonFinite);
    EXPECT_NE(std::string(e.what()).find("step 5: loss nan"), std::string::npos) << e.what();
  }
  // Every loss above the window's mean by a hair is a "spike" here.
  auto spiky = tiny("");
  spiky.train.steps = 40;
  spiky.guard.spike_z = 1e-9;
  spiky.guard.spike_window = 3;
  spiky.guard.max_spikes = 1;
  try {
    run_training(spiky);
    ADD_FAILURE() << "no TrainingFault";
  } catch (const ft::TrainingFault& e) {
    EXPECT_EQ(e.exit_code(), ft::kExitSpikes);
    EXPECT_NE(std::string(e.what()).find("1 loss spike(s) in a row"), std::string::npos) << e.what();
  }
  // Off: the same run trains to the end.
  spiky.guard.spike_z = 0;
  EXPECT_EQ(run_training(spiky).losses.size(), 40u);
}

}  // namespace
}  // namespace anvil::train
