// Context parallelism (--cp N) against one process on the same global
// batch: gpt2-tiny, llama-tiny and zaya-tiny (CCA + MoE) at cp 2, cp 4,
// dp 2 x cp 2 and (zaya) dp 2 x cp 2 with ep 2; every loss within 1e-6
// relative, the same routing choices (every MoE layer's tokens per expert
// at every step), the final weights within 1e-5 relative in norm. The
// corpus is packed text: its documents (lines of ~50 bytes, byte tokens)
// start anywhere in a row, so inside chunks, and their first tokens see the
// previous document across chunk boundaries exactly as in one process.
// T = 32: chunks of 8 (cp 2) and 4 (cp 4) tokens, so the attention's key
// blocks and the halos cross ranks. Also: checkpoints reshape between cp
// layouts, anvil launch restarts a dp x cp grid by whole groups, a recipe's
// phase runs under cp and resumes mid-phase, and bad --cp values are
// refused before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/train_runs.hpp"

namespace {

using anvil::test_support::expect_same_trajectory;
using anvil::test_support::train;
using anvil::test_support::TrainRun;
using anvil::test_support::work_dir;

std::string mpirun(int ranks) {
  return std::string(ANVIL_MPIRUN) + " --allow-run-as-root --oversubscribe -np " +
         std::to_string(ranks) + " ";
}

// Runs a shell command with one thread per process; its exit status.
int shell(const std::string& cmd, const std::string& log) {
  const int st = std::system(("OMP_NUM_THREADS=1 timeout 300 " + cmd + " > " + log + " 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// step -> loss from a run's metrics.jsonl (a resumed run's repeated steps
// keep their last value).
std::map<int64_t, double> losses_of(const std::string& run) {
  std::map<int64_t, double> out;
  std::istringstream lines(anvil::read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto m = nlohmann::json::parse(line);
    if (m.contains("loss") && m.contains("step")) out[m["step"].get<int64_t>()] = m["loss"].get<double>();
  }
  return out;
}

std::string model_args(const std::string& config, int T = 32) {
  return " --config " ANVIL_SOURCE_DIR "/tests/configs/" + config +
         ".json --set vocab_size=256 -T " + std::to_string(T) +
         " --lr 3e-3 --warmup 2 --val-batches 12";
}

void expect_same_routing(const TrainRun& got, const TrainRun& want, const std::string& what) {
  ASSERT_EQ(got.router_loads.size(), want.router_loads.size()) << what;
  for (size_t s = 0; s < want.router_loads.size(); ++s)
    EXPECT_EQ(got.router_loads[s], want.router_loads[s]) << what << ": router loads of step " << s + 1;
}

// The weights within 1e-5 of their norm; single entries within 5e-5 of
// their tensor's largest: the ranks sum each weight gradient's rows in
// another order than one GEMM over all rows (~1e-7 relative), and AdamW
// divides by the root of the second moment, so near-zero gradient entries
// carry that rounding into the weights at full size (measured up to 2.9e-5
// of the largest entry, 2.4e-6 in norm). A broken term moves both by > 1e-3.
constexpr double kNormTol = 1e-5, kEntryTol = 5e-5;

struct Layout {
  const char* name;
  int ranks;
  const char* args;  // with the global batch of 4 rows
};

const Layout kLayouts[] = {{"cp2", 2, " -B 4 --cp 2"},
                           {"cp4", 4, " -B 4 --cp 4"},
                           {"dp2xcp2", 4, " -B 2 --cp 2"}};

TEST(ContextParallel, DenseModelsMatchOneProcess) {
  for (const std::string config : {"gpt2-tiny", "llama-tiny"}) {
    const std::string args = model_args(config) + " --steps 20";
    const TrainRun one = train(1, "cp-" + config + "-1", args + " -B 4");
    for (const Layout& l : kLayouts) {
      const std::string what = config + " " + l.name;
      expect_same_trajectory(train(l.ranks, "cp-" + config + "-" + l.name, args + l.args), one,
                             1e-6, what, kEntryTol, kNormTol);
    }
  }
}

TEST(ContextParallel, Zaya1MatchesOneProcessWithTheSameRouting) {
  const std::string args = model_args("zaya-tiny") + " --set n_experts=4 --steps 20";
  const TrainRun one = train(1, "cp-zaya-1", args + " -B 4");
  ASSERT_EQ(one.router_loads.size(), 20u);
  std::vector<Layout> layouts(std::begin(kLayouts), std::end(kLayouts));
  layouts.push_back({"dp2xcp2-ep2", 4, " -B 2 --cp 2 --ep 2"});
  for (const Layout& l : layouts) {
    const std::string what = std::string("zaya-tiny ") + l.name;
    const TrainRun got = train(l.ranks, std::string("cp-zaya-") + l.name, args + l.args);
    expect_same_trajectory(got, one, 1e-6, what, kEntryTol, kNormTol);
    expect_same_routing(got, one, what);
  }
}

// A checkpoint written under cp 2 (ZeRO-1 over the two ranks) resumes at
// cp 1, at dp 2 and at dp 2 x cp 2 on the losses of the run that never
// stopped: the weights and optimizer state are global tensors, and the
// global batch is the same 4 rows in every layout.
TEST(ContextParallel, CheckpointsResumeOnOtherLayouts) {
  const std::string args =
      model_args("zaya-tiny") + " --set n_experts=4 --schedule constant --zero";
  const TrainRun straight = train(2, "cp-ckpt-straight", args + " -B 4 --cp 2 --steps 20");
  const TrainRun half = train(2, "cp-ckpt-half", args + " -B 4 --cp 2 --steps 10");
  ASSERT_FALSE(half.checkpoint.empty());
  for (const Layout& l : {Layout{"cp1", 1, " -B 4"}, Layout{"dp2", 2, " -B 2"},
                          Layout{"dp2xcp2", 4, " -B 2 --cp 2"}}) {
    const TrainRun rest = train(l.ranks, std::string("cp-ckpt-") + l.name,
                                args + l.args + " --steps 20 --resume " + half.checkpoint);
    ASSERT_EQ(rest.losses.size(), 10u) << l.name;
    for (size_t s = 0; s < 10; ++s)
      EXPECT_LE(std::abs(rest.losses[s] - straight.losses[10 + s]), 1e-6 * straight.losses[10 + s])
          << l.name << ": step " << 11 + s;
  }
}

// Bad --cp values stop before any work, with one line naming the option.
TEST(ContextParallel, RefusesBadLayoutsBeforeAnyWork) {
  struct Case {
    int ranks, T;
    std::string args, names;
  };
  for (const Case& c : {Case{1, 32, " --cp 2", "--cp"}, Case{3, 32, " --cp 2", "--cp"},
                        Case{2, 30, " --cp 2", "--seq"}, Case{4, 8, " --cp 4", "--seq"},
                        Case{1, 32, " --memory-limit-gib 0.001", "--memory-limit-gib"}}) {
    const std::string args = model_args("llama-tiny", c.T) + " --steps 2 -B 2";
    const std::string name = "cp-bad-" + std::to_string(c.ranks) + "-" + std::to_string(c.T) + "-" +
                             std::to_string(c.names.size());
    const std::string log = (anvil::test_support::work_dir() / (name + ".log")).string();
    const std::string launcher = c.ranks == 1 ? std::string()
                                              : std::string(ANVIL_MPIRUN) +
                                                    " --allow-run-as-root --oversubscribe -np " +
                                                    std::to_string(c.ranks) + " ";
    const std::string cmd = "OMP_NUM_THREADS=1 timeout 120 " + launcher + ANVIL_BINARY +
                            " train" + args + c.args + " > " + log + " 2>&1";
    const int st = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << cmd;
    const std::string out = anvil::read_file(log);
    EXPECT_NE(out.find("anvil: error: "), std::string::npos) << cmd << "\n" << out;
    EXPECT_NE(out.find(c.names), std::string::npos) << cmd << ": does not name " << c.names
                                                    << "\n" << out;
    EXPECT_EQ(out.find("step 1"), std::string::npos) << cmd << ": a step ran\n" << out;
  }
}

// anvil launch on a dp 2 x cp 2 grid: a rank killed at step 15, the job
// restarts on one context-parallel group (np 2, the same -B with two
// micro-batches: the same global batch) from the 4-rank checkpoint and ends on the uninterrupted losses.
// A --np that splits a group is refused.
TEST(ContextParallel, LaunchRecoversAndShrinksByWholeGroups) {
  const std::string args = model_args("zaya-tiny") +
                           " --set n_experts=4 --schedule constant --steps 30 --ckpt-every 10 --cp 2";
  const TrainRun straight = train(4, "cp-launch-straight", args + " -B 2");
  ASSERT_EQ(straight.losses.size(), 30u);
  const std::string out = (work_dir() / "cp-launch").string();
  std::filesystem::remove_all(out);
  const std::string launch = std::string(ANVIL_BINARY) + " launch --np 4 --min-np 2 --shrink-by 2 " +
                             "--inject kill@15:1 --backoff 0.1 -- --data " +
                             (work_dir() / "text.txt").string() + " --out " + out +
                             " --peak-gflops 1 --log-every 1000 " + args + " -B 2 --json-out " +
                             out + ".json";
  ASSERT_EQ(shell(launch, out + ".log"), 0) << launch << "\n" << anvil::read_file(out + ".log");
  const std::string journal = anvil::read_file(out + "/journal.jsonl");
  EXPECT_NE(journal.find("\"event\":\"shrink\",\"np\":2"), std::string::npos) << journal;
  EXPECT_NE(journal.find("\"accum\":2,\"batch\":2"), std::string::npos) << journal;
  const auto j = nlohmann::json::parse(anvil::read_file(out + ".json"));
  EXPECT_EQ(j.at("ranks").get<int>(), 2);
  const auto rest = j.at("losses").get<std::vector<double>>();
  ASSERT_EQ(rest.size(), 20u);
  for (size_t s = 0; s < rest.size(); ++s)
    EXPECT_LE(std::abs(rest[s] - straight.losses[10 + s]), 1e-6 * straight.losses[10 + s])
        << "step " << 11 + s;
  const std::string bad = std::string(ANVIL_BINARY) + " launch --np 3 -- --out " + out + "-bad" + args;
  EXPECT_EQ(shell(bad, out + "-bad.log"), 2) << bad;
  EXPECT_NE(anvil::read_file(out + "-bad.log").find("--np 3"), std::string::npos)
      << anvil::read_file(out + "-bad.log");
}

// A recipe of zaya-tiny (4 experts) on the shared text, batch 2, lr 3e-3,
// with these phases, written to DIR/recipe.json (DIR made afresh).
std::string tiny_zaya_recipe(const std::string& dir, uint64_t seed, int ckpt_every,
                             const nlohmann::json& phases) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const nlohmann::json recipe = {{"config", ANVIL_SOURCE_DIR "/tests/configs/zaya-tiny.json"},
                                 {"set", {"vocab_size=256", "n_experts=4"}},
                                 {"sources", {{"text", (work_dir() / "text.txt").string()}}},
                                 {"seed", seed},
                                 {"lr", 3e-3},
                                 {"batch", 2},
                                 {"ckpt_every", ckpt_every},
                                 {"phases", phases}};
  std::ofstream(dir + "/recipe.json") << recipe.dump(2);
  return dir + "/recipe.json";
}

// A recipe whose second phase doubles the sequence and runs it under cp 2
// (the first runs dp 2 on the same two ranks): killed mid-phase 2 and
// resumed, the same loss at every step. Under one process the cp phase is
// refused before any work, naming the phase's key.
TEST(ContextParallel, RecipePhaseRunsUnderCpAndResumesMidPhase) {
  const std::string dir = (work_dir() / "cp-recipe").string();
  tiny_zaya_recipe(
      dir, 7, 3,
      {{{"name", "short"}, {"tokens", 1024}, {"seq", 32}, {"warmup", 2}},  // 8 steps at dp 2
       {{"name", "long"},
        {"tokens", 768},  // 6 steps at cp 2
        {"seq", 64},
        {"cp", 2},
        {"rope_theta", 1e5},
        {"lr", 1e-3}}});
  const std::string run = mpirun(2) + ANVIL_BINARY + " train --peak-gflops 1 --recipe " + dir +
                          "/recipe.json --out " + dir;
  ASSERT_EQ(shell(run + "/straight", dir + "/straight.log"), 0) << anvil::read_file(dir + "/straight.log");
  const auto straight = losses_of(dir + "/straight");
  ASSERT_EQ(straight.size(), 14u);
  const std::string log = anvil::read_file(dir + "/straight.log");
  EXPECT_NE(log.find("phase 2/2 'long'"), std::string::npos) << log;
  EXPECT_NE(log.find(", cp 2,"), std::string::npos) << log;
  // Killed at step 13 (the newest checkpoint is step 12, mid-phase 2).
  EXPECT_NE(shell(run + "/killed --inject kill@13:1", dir + "/killed.log"), 0);
  ASSERT_EQ(shell(run + "/killed --resume latest", dir + "/resumed.log"), 0)
      << anvil::read_file(dir + "/resumed.log");
  EXPECT_EQ(losses_of(dir + "/killed"), straight);
  const std::string one = std::string(ANVIL_BINARY) + " train --recipe " + dir + "/recipe.json --out " +
                          dir + "/one";
  EXPECT_EQ(shell(one, dir + "/one.log"), 2);
  EXPECT_NE(anvil::read_file(dir + "/one.log").find("phases[1].cp"), std::string::npos)
      << anvil::read_file(dir + "/one.log");
  EXPECT_FALSE(std::filesystem::exists(dir + "/one/metrics.jsonl"));
}

// Phases at two context-parallel degrees in one process (cp 2, then cp 4
// on the same four ranks: a progressive context extension): the second
// phase takes its own group, with the losses of a run that enters it in a
// new process (killed in it and resumed from the boundary's checkpoint).
TEST(ContextParallel, RecipePhasesAtTwoCpDegreesTakeTheirOwnGroups) {
  const std::string dir = (work_dir() / "cp-two-degrees").string();
  tiny_zaya_recipe(dir, 5, 4,
                   {{{"name", "cp2"}, {"tokens", 512}, {"seq", 32}, {"cp", 2}},    // 4 steps
                    {{"name", "cp4"}, {"tokens", 384}, {"seq", 64}, {"cp", 4}}});  // 3 steps
  const std::string run = mpirun(4) + ANVIL_BINARY + " train --peak-gflops 1 --recipe " + dir +
                          "/recipe.json --out " + dir;
  ASSERT_EQ(shell(run + "/straight", dir + "/straight.log"), 0)
      << anvil::read_file(dir + "/straight.log");
  const auto straight = losses_of(dir + "/straight");
  ASSERT_EQ(straight.size(), 7u);
  EXPECT_NE(anvil::read_file(dir + "/straight.log").find(", cp 4,"), std::string::npos)
      << anvil::read_file(dir + "/straight.log");
  EXPECT_NE(shell(run + "/entered --inject kill@6:1", dir + "/killed.log"), 0);
  ASSERT_EQ(shell(run + "/entered --resume latest", dir + "/resumed.log"), 0)
      << anvil::read_file(dir + "/resumed.log");
  EXPECT_EQ(losses_of(dir + "/entered"), straight);
}

}  // namespace
