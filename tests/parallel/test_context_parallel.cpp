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
// layouts, and bad --cp values are refused before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "support/train_runs.hpp"

namespace {

using anvil::test_support::expect_same_trajectory;
using anvil::test_support::train;
using anvil::test_support::TrainRun;

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

}  // namespace
