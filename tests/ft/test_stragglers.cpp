// A straggler on two processes: --inject slow-rank@3:1=3 makes rank 1 take
// three times its compute from step 3 on; rank 0 names it within 10 steps,
// metrics.jsonl carries every rank's compute and wait per step, and the
// losses are the unslowed run's.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "anvil/base/files.hpp"
#include "support/train_runs.hpp"

namespace {
namespace fs = std::filesystem;

TEST(Stragglers, ARankSlowedThreeTimesIsNamedWithinTenSteps) {
  const fs::path dir = anvil::test_support::work_dir() / "stragglers";
  fs::create_directories(dir);
  auto run = [&](const std::string& name, const std::string& extra) {
    const std::string cmd =
        "OMP_NUM_THREADS=1 timeout 300 " + std::string(ANVIL_MPIRUN) +
        " --allow-run-as-root --oversubscribe -np 2 " + ANVIL_BINARY +
        " train --config " ANVIL_SOURCE_DIR "/tests/configs/llama-tiny.json --set vocab_size=256 "
        "-B 4 -T 64 --steps 16 --peak-gflops 1 --log-every 1 --data " +
        (anvil::test_support::work_dir() / "text.txt").string() + " --out " + (dir / name).string() +
        " --json-out " + (dir / name).string() + ".json " + extra + " > " + (dir / name).string() +
        ".log 2>&1";
    const int st = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << anvil::read_file((dir / name).string() + ".log");
    return anvil::read_file((dir / name).string() + ".log");
  };
  const std::string slow = run("slow", "--inject slow-rank@3:1=3");
  const auto at = slow.find("rank 1 is a straggler");
  ASSERT_NE(at, std::string::npos) << slow;
  EXPECT_EQ(slow.find("rank 0 is a straggler"), std::string::npos) << slow;
  // Named by step 12 (3 + 10 - 1): the warning follows that step's line.
  const auto line12 = slow.find("step 13/16");
  EXPECT_TRUE(line12 == std::string::npos || at < line12) << slow;
  EXPECT_NE(slow.find("slowest rank 1 compute"), std::string::npos) << slow;
  std::istringstream lines(anvil::read_file((dir / "slow" / "metrics.jsonl").string()));
  int with_ranks = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto m = nlohmann::json::parse(line);
    if (m.contains("rank_compute_s") && m["rank_compute_s"].size() == 2 &&
        m.contains("rank_wait_s") && m["rank_wait_s"].size() == 2)
      ++with_ranks;
  }
  EXPECT_EQ(with_ranks, 16);
  run("plain", "");
  EXPECT_EQ(nlohmann::json::parse(anvil::read_file((dir / "slow.json").string()))["losses"],
            nlohmann::json::parse(anvil::read_file((dir / "plain.json").string()))["losses"]);
}

// --straggler-action exclude under anvil launch: the trainer checkpoints at
// the step the straggler is named and exits 12; the supervisor restarts on
// one rank fewer at the same global batch, and the losses go on as the
// uninterrupted 2-rank run's.
TEST(Stragglers, ExcludeRestartsWithoutTheStragglerOnTheSameLosses) {
  const fs::path dir = anvil::test_support::work_dir() / "straggler-exclude";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string args = " --config " ANVIL_SOURCE_DIR
                           "/tests/configs/llama-tiny.json --set vocab_size=256 -T 64 --steps 16 "
                           "--peak-gflops 1 --log-every 1 --data " +
                           (anvil::test_support::work_dir() / "text.txt").string();
  const std::string straight_cmd = "OMP_NUM_THREADS=1 timeout 300 " + std::string(ANVIL_MPIRUN) +
                                   " --allow-run-as-root --oversubscribe -np 2 " + ANVIL_BINARY +
                                   " train" + args + " -B 4 --json-out " + (dir / "straight.json").string() +
                                   " > " + (dir / "straight.log").string() + " 2>&1";
  ASSERT_EQ(std::system(straight_cmd.c_str()), 0) << anvil::read_file((dir / "straight.log").string());
  const std::string cmd = "OMP_NUM_THREADS=1 timeout 300 " + std::string(ANVIL_BINARY) +
                          " launch --np 2 --min-ranks 1 --inject slow-rank@3:1=3 --backoff 0.1 --" +
                          args + " -B 4 --straggler-action exclude --out " + (dir / "run").string() +
                          " --json-out " + (dir / "run.json").string() + " > " +
                          (dir / "run.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << anvil::read_file((dir / "run.log").string());
  const std::string journal = anvil::read_file((dir / "run" / "journal.jsonl").string());
  EXPECT_NE(journal.find("\"cause\":\"straggler\""), std::string::npos) << journal;
  EXPECT_NE(journal.find("\"rank\":1"), std::string::npos) << journal;
  EXPECT_NE(journal.find("\"event\":\"shrink\",\"np\":1"), std::string::npos) << journal;
  const auto straight = nlohmann::json::parse(anvil::read_file((dir / "straight.json").string()));
  const auto rest = nlohmann::json::parse(anvil::read_file((dir / "run.json").string()));
  EXPECT_EQ(rest["ranks"].get<int>(), 1);
  const auto want = straight["losses"].get<std::vector<double>>();
  const auto got = rest["losses"].get<std::vector<double>>();  // the steps after the restart
  ASSERT_GT(got.size(), 0u);
  ASSERT_LT(got.size(), want.size());
  const size_t first = want.size() - got.size();
  double worst = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    EXPECT_LE(std::abs(got[s] - want[first + s]), 1e-6 * want[first + s]) << "step " << first + s + 1;
    worst = std::max(worst, std::abs(got[s] - want[first + s]) / want[first + s]);
  }
  std::printf("straggler excluded at step %zu; steps %zu-%zu on 1 rank, largest relative loss "
              "difference %.2e\n", first, first + 1, want.size(), worst);
}

}  // namespace
