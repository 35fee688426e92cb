// A full disk under the checkpoints: the test mounts a small tmpfs as the
// run directory (skipped, with the reason, where mounting is not allowed),
// with room for about two and a half checkpoints. Twenty saves with
// --keep 3 fill it by themselves (the save prunes down to the newest intact
// checkpoint and retries), and --inject disk-full fills what is left for a
// while: with --on-save-error continue the run trains to the end on the
// uninterrupted losses and saves again once space returns; with stop it
// exits 1 and its newest intact checkpoint resumes on the same losses. No
// temporary folder is ever left behind.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "support/train_runs.hpp"

namespace {
namespace fs = std::filesystem;
using anvil::test_support::work_dir;

struct Tmpfs {
  fs::path dir;
  bool mounted = false;
  Tmpfs(fs::path d, uint64_t bytes) : dir(std::move(d)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    mounted = std::system(("mount -t tmpfs -o size=" + std::to_string(bytes) + " tmpfs " +
                           dir.string() + " 2>/dev/null")
                              .c_str()) == 0;
  }
  ~Tmpfs() {
    if (mounted) (void)std::system(("umount " + dir.string()).c_str());
  }
};

int shell(const std::string& cmd, const std::string& log) {
  const int st = std::system(("OMP_NUM_THREADS=1 timeout 300 " + cmd + " > " + log + " 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string train_cmd(int ranks, const fs::path& out, const fs::path& summary,
                      const std::string& extra) {
  const std::string launcher =
      ranks == 1 ? "" : std::string(ANVIL_MPIRUN) + " --allow-run-as-root --oversubscribe -np " +
                            std::to_string(ranks) + " ";
  return launcher + ANVIL_BINARY + " train --config " ANVIL_SOURCE_DIR
                                   "/tests/configs/gpt2-tiny.json --set vocab_size=256 -B 2 -T 32 "
                                   "--steps 40 --ckpt-every 2 --peak-gflops 1 --log-every 1000 --data " +
         (work_dir() / "text.txt").string() + " --out " + out.string() + " --json-out " +
         summary.string() + " " + extra;
}

// The losses of the steps a run took (its --json-out summary, written
// outside the full disk).
std::vector<double> losses_of(const fs::path& summary) {
  return nlohmann::json::parse(anvil::read_file(summary.string()))
      .at("losses")
      .get<std::vector<double>>();
}

std::vector<std::string> temporary_folders(const fs::path& run) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().filename().string().rfind(".step-", 0) == 0) out.push_back(e.path().string());
  return out;
}

uint64_t folder_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += (e.file_size() + 4095) / 4096 * 4096;
  return n;
}

TEST(DiskFull, SavesIntoAFillingTmpfsPruneRetryAndContinueOrStop) {
  const fs::path dir = work_dir() / "disk_full";
  fs::create_directories(dir);
  // The uninterrupted runs (1 and 2 ranks) and one checkpoint's size.
  ASSERT_EQ(shell(train_cmd(2, dir / "ref2", dir / "ref2.json", "--keep 0"), (dir / "ref2.log").string()), 0)
      << anvil::read_file((dir / "ref2.log").string());
  ASSERT_EQ(shell(train_cmd(1, dir / "ref1", dir / "ref1.json", "--keep 0"), (dir / "ref1.log").string()), 0)
      << anvil::read_file((dir / "ref1.log").string());
  const uint64_t ckpt = folder_bytes(dir / "ref2" / "step-00000002");
  const uint64_t room = ckpt * 5 / 2 + (uint64_t{256} << 10);  // + metrics.jsonl, train.json
  {
    Tmpfs disk(dir / "continue", room);
    if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)";
    const fs::path run = disk.dir / "run";
    const std::string log = (dir / "continue.log").string();
    ASSERT_EQ(shell(train_cmd(2, run, dir / "continue.json", "--keep 3 --on-save-error continue --inject disk-full@20=10"),
                    log),
              0)
        << anvil::read_file(log);
    const std::string text = anvil::read_file(log);
    EXPECT_NE(text.find("disk full; pruned to the newest intact checkpoint and retried"),
              std::string::npos)
        << text;
    for (const char* step : {"step 20 was not saved", "step 28 was not saved"})
      EXPECT_NE(text.find(step), std::string::npos) << step << "\n" << text;
    EXPECT_EQ(text.find("step 30 was not saved"), std::string::npos) << text;
    EXPECT_TRUE(temporary_folders(run).empty());
    EXPECT_TRUE(anvil::ckpt::verify_checkpoint((run / "step-00000040").string()).problems.empty());
    EXPECT_EQ(losses_of(dir / "continue.json"), losses_of(dir / "ref2.json"));
  }
  {
    Tmpfs disk(dir / "stop", room);
    ASSERT_TRUE(disk.mounted);
    const fs::path run = disk.dir / "run";
    const std::string log = (dir / "stop.log").string();
    EXPECT_EQ(shell(train_cmd(1, run, dir / "stop.json", "--keep 3 --inject disk-full@12"), log), 1)
        << anvil::read_file(log);
    EXPECT_TRUE(temporary_folders(run).empty());
    ASSERT_EQ(anvil::ckpt::newest_intact_checkpoint(run.string(), {}),
              (run / "step-00000010").string());
    fs::remove(run / ".disk-full-filler");
    ASSERT_EQ(shell(train_cmd(1, run, dir / "stop.json", "--keep 3 --resume latest"), log), 0) << anvil::read_file(log);
    EXPECT_TRUE(temporary_folders(run).empty());
    const auto want = losses_of(dir / "ref1.json");
    EXPECT_EQ(losses_of(dir / "stop.json"), std::vector<double>(want.begin() + 10, want.end()));
  }
}

}  // namespace
