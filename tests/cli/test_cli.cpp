// The anvil binary as a user meets it: bad flags get one line naming the flag
// and exit status 2; good runs print what they promise.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/train/trainer.hpp"
#include "cli/cli_run.hpp"

namespace {

using anvil::test_support::CliRun;
using anvil::test_support::expect_usage_error;
using anvil::test_support::fresh_dir;
using anvil::test_support::run_anvil;

TEST(Cli, RejectsBadFlagsAndValuesWithOneLineAndStatus2) {
  expect_usage_error("bench gemm --threads abc", "--threads");
  expect_usage_error("bench gemm --threads 0", "--threads");
  expect_usage_error("bench gemm --preset cubes", "--preset");
  expect_usage_error("bench gemm --dtype f16", "--dtype");
  expect_usage_error("bench gemm --sizes 12Q", "--sizes");
  expect_usage_error("bench gemm --sizes 0", "--sizes");
  expect_usage_error("bench gemm --min-time -1", "--min-time");
  expect_usage_error("bench gemm --preset model", "--config");
  expect_usage_error("bench gemm --preset model --config /nonexistent.json", "/nonexistent.json");
  expect_usage_error("bench membw --kernels gather", "--kernels");
  expect_usage_error("bench membw --sizes 1X", "--sizes");
  expect_usage_error("hw --min-time 0", "--min-time");
  expect_usage_error("hw --no-such-flag", "--no-such-flag");
  expect_usage_error("frobnicate", "frobnicate");
}

TEST(Cli, TrainGenerateAndSizeRejectBadInputWithOneLine) {
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  expect_usage_error("train", "--config");
  expect_usage_error("train --config /nonexistent.json", "/nonexistent.json");
  expect_usage_error("train --config " + cfg + " --set d_model=0", "d_model");
  expect_usage_error("train --config " + cfg + " --set colour=blue", "colour");
  expect_usage_error("train --config " + cfg + " --seq 71", "--seq");
  expect_usage_error("train --config " + cfg + " --schedule linear", "--schedule");
  expect_usage_error("train --config " + cfg + " --precision fp8", "--precision");
  expect_usage_error("train --config " + cfg + " --data /nonexistent.txt", "/nonexistent.txt");
  expect_usage_error("train --config " + cfg + " --steps 0", "--steps");
  expect_usage_error("train --config " + cfg + " --resume /nonexistent-run", "/nonexistent-run");
  expect_usage_error("train --config " + cfg + " --accum 2 --resume-new-accum", "--resume");
  expect_usage_error("generate --checkpoint /nonexistent-run --prompt hi", "/nonexistent-run");
  expect_usage_error("size --config /nonexistent.json", "/nonexistent.json");
  expect_usage_error("data tokenize --text /nonexistent.txt --out x.tok", "/nonexistent.txt");
  expect_usage_error("data frobnicate", "frobnicate");
}

TEST(Cli, OutputsInfinitiesSignsAndConflictsAreRefusedBeforeAnyWork) {
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  const std::string dir = fresh_dir("cli-outputs");
  const std::string file = dir + "/a-file";
  std::ofstream(file) << "x";
  const std::string train = "train --config " + cfg + " -B 1 -T 16 --steps 1 ";
  expect_usage_error(train + "--out " + file, "--out");
  expect_usage_error(train + "--out " + dir + "/run --tensorboard " + file, "--tensorboard");
  expect_usage_error(train + "--out " + dir + "/run --json-out " + file + "/x.json", "--json-out");
  expect_usage_error(train + "--heartbeat " + file, "--heartbeat");
  expect_usage_error(train + "--lr inf", "--lr");
  expect_usage_error(train + "--seed -1", "--seed");
  expect_usage_error("generate --checkpoint " + dir + " --prompt hi --temperature inf",
                     "--temperature");
  expect_usage_error("generate --checkpoint " + dir + " --prompt hi --prompt-tokens 1", "--prompt");
  expect_usage_error("bench comm -b 7 -e 13 --dtype f64", "--minbytes");
  expect_usage_error("bench gemm --sizes 64 --json --csv", "--csv");
  expect_usage_error("data tokenize --text " + file + " --out " + dir, "--out");
  expect_usage_error("ckpt import --checkpoint " + dir + " --out " + file, "--out");
  expect_usage_error("ckpt reshape --checkpoint " + dir + " --to 100000 --out " + dir, "--to");
  const std::string run_file = dir + "/train.json";
  std::ofstream(run_file) << R"({"no_such_section": {}})";
  expect_usage_error("train --train " + run_file + " --config " + cfg, "no_such_section");
  const std::string recipe = std::string(ANVIL_SOURCE_DIR) + "/recipes/zaya-small-3phase.json";
  expect_usage_error("train --recipe " + recipe + " --out " + dir + "/r -B 2", "--batch");
  // Nothing was created next to the file: no run directory, no metrics.
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/r"));
}

TEST(Cli, ResumingPastTheLastStepIsBadInputAtTheLastStepNothingToDo) {
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  const std::string dir = fresh_dir("cli-resume-past");
  const std::string train = "train --config " + cfg + " -B 1 -T 16 --threads 1 ";
  ASSERT_EQ(run_anvil(train + "--steps 2 --out " + dir + "/run", false).status, 0);
  expect_usage_error(train + "--steps 1 --resume " + dir + "/run --out " + dir + "/r1", "--steps");
  EXPECT_FALSE(std::filesystem::exists(dir + "/r1"));
  // A supervisor's restart after the final save: nothing left, success.
  EXPECT_EQ(run_anvil(train + "--steps 2 --resume latest --out " + dir + "/run", false).status, 0);
}

// The exit status of a shell line that starts `command` in the background,
// waits `delay` seconds, runs `signal_it` and waits for the command.
int status_after_signal(const std::string& command, double delay, const std::string& signal_it) {
  const std::string line = "sh -c '" + command + " > /dev/null 2>&1 & p=$!; sleep " +
                           std::to_string(delay) + "; " + signal_it + "; wait $p; echo $?'";
  FILE* f = ::popen(line.c_str(), "r");
  if (f == nullptr) return -1;
  int status = -1;
  if (std::fscanf(f, "%d", &status) != 1) status = -1;
  ::pclose(f);
  return status;
}

TEST(Cli, ASignalStopsTrainingAtAStepWithItsCheckpointAndStatus128PlusTheSignal) {
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  const std::string dir = fresh_dir("cli-signal");
  const std::string train = std::string(ANVIL_BINARY) + " train --config " + cfg +
                            " -B 1 -T 16 --threads 1 --steps 60 --out " + dir + "/run";
  EXPECT_EQ(status_after_signal(train + " --inject slow@1=50", 1.5, "kill -TERM $p"), 128 + 15);
  const auto steps = anvil::ckpt::checkpoint_dirs(dir + "/run");
  ASSERT_FALSE(steps.empty());
  EXPECT_NE(steps.back(), dir + "/run/step-00000060");  // stopped before the end
  EXPECT_EQ(run_anvil("ckpt verify " + dir + "/run", false).status, 0);
  EXPECT_EQ(run_anvil(train.substr(train.find(" train ") + 1) + " --resume latest", false).status,
            0);
  // Under anvil launch a signal to the job (a preemption) is a fault to
  // resume from; the launch finishes the run.
  const std::string launch = std::string(ANVIL_BINARY) + " launch --np 1 --backoff 0.1 --inject " +
                             "slow@1=50 -- --config " + cfg + " -B 1 -T 16 --threads 1 --steps " +
                             "60 --out " + dir + "/launched";
  EXPECT_EQ(status_after_signal(launch, 2.0, "pkill -TERM -f \"[l]aunched --heartbeat\""), 0);
  const std::string journal = anvil::read_file(dir + "/launched/journal.jsonl");
  EXPECT_NE(journal.find("\"cause\":\"stopped\""), std::string::npos) << journal;
  EXPECT_NE(journal.find("\"event\":\"finished\",\"step\":60"), std::string::npos) << journal;
}

TEST(Cli, AStateJsonThatDisagreesWithItsIndexIsADamagedCheckpoint) {
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  const std::string dir = fresh_dir("cli-state-json");
  const std::string train = "train --config " + cfg + " -B 1 -T 16 --threads 1 --ckpt-every 1 " +
                            "--keep 0 --out " + dir + "/run";
  ASSERT_EQ(run_anvil(train + " --steps 2", false).status, 0);
  const std::string state = dir + "/run/step-00000002/state.json";
  std::string text = anvil::read_file(state);
  const auto at = text.find("\"step\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 9, "\"step\": 3");
  std::ofstream(state) << text;
  const CliRun v = run_anvil("ckpt verify " + dir + "/run/step-00000002", true);
  EXPECT_EQ(v.status, 2) << v.out;
  EXPECT_NE(v.out.find("train_state"), std::string::npos) << v.out;
  // A resume passes over it to the step before, with a warning.
  const CliRun r = run_anvil(train + " --steps 3 --resume latest", true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning"), std::string::npos) << r.out;
  // Resumed with a longer --steps, a cosine's rate jumps: said, with both.
  const CliRun longer = run_anvil(train + " --steps 6 --resume latest", true);
  EXPECT_EQ(longer.status, 0) << longer.out;
  EXPECT_NE(
      longer.out.find("the learning-rate schedule differs from the checkpoint's (total 3 -> 6)"),
      std::string::npos)
      << longer.out;
}

// A character the tokenizer spells in byte pieces comes out whole: its
// first bytes alone decode to U+FFFD, which must not reach the output.
TEST(Cli, GenerateStreamsCharactersSplitOverBytePiecesWhole) {
  const std::string dir = fresh_dir("cli-utf8");
  const std::string kjv = std::string(ANVIL_SOURCE_DIR) + "/tests/golden/text.txt";
  ASSERT_EQ(
      run_anvil("data tokenizer train --text " + kjv + " --vocab 400 --out " + dir + "/sp", false)
          .status,
      0);
  {
    std::ofstream text(dir + "/zh.txt");
    for (int i = 0; i < 300; ++i) text << "ЖЖЖ a ЖЖ a\n";  // Zhe: no piece of its own
  }
  ASSERT_EQ(run_anvil("data tokenize --text " + dir + "/zh.txt --tokenizer " + dir +
                          "/sp.model --out " + dir + "/zh.tok",
                      false)
                .status,
            0);
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  ASSERT_EQ(run_anvil("train --config " + cfg + " --set vocab_size=400 -B 2 -T 16 --steps 150 " +
                          "--lr 1e-2 --threads 1 --peak-gflops 1 --data " + dir + "/zh.tok --out " +
                          dir + "/run",
                      false)
                .status,
            0);
  const CliRun g = run_anvil(
      "generate --checkpoint " + dir + "/run --prompt 'ЖЖ a' " + "--max-new 12 --temperature 0",
      false);
  ASSERT_EQ(g.status, 0);
  EXPECT_EQ(g.out.find("\xEF\xBF\xBD"), std::string::npos) << g.out;  // no U+FFFD
  EXPECT_NE(g.out.find("Ж", 6), std::string::npos) << g.out;          // a Zhe past the prompt
}

TEST(Cli, TrainsOnTextCheckpointsAndGenerates) {
  const std::string dir = fresh_dir("cli_train");
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 300; ++i)
      text << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  const CliRun t = run_anvil("train --config " + cfg + " --set vocab_size=256 --data " + dir +
                                 "/text.txt -B 2 -T 32 --steps 6 --peak-gflops 1 --out " + dir +
                                 "/run --json-out " + dir + "/summary.json",
                             false);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("memory plan: parameters"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("step 6/6"), std::string::npos) << t.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/step-00000006/index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/step-00000006/rank-00000.safetensors"));
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    EXPECT_TRUE(nlohmann::json::parse(line).contains("loss"));
  }
  EXPECT_EQ(lines, 6);
  const auto summary = nlohmann::json::parse(std::ifstream(dir + "/summary.json"));
  EXPECT_EQ(summary["losses"].size(), 6u);
  const CliRun g =
      run_anvil("generate --checkpoint " + dir + "/run --prompt the --max-new 10", false);
  ASSERT_EQ(g.status, 0);
  EXPECT_EQ(g.out.size(), std::string("the").size() + 10 + 1);  // prompt, 10 bytes, newline
  const CliRun s = run_anvil("size --config " + cfg + " --json", false);
  ASSERT_EQ(s.status, 0);
  EXPECT_GT(nlohmann::json::parse(s.out)["total"].get<int64_t>(), 0);
}

TEST(Cli, NoSubcommandIsAUsageError) {
  const CliRun r = run_anvil("", true);
  EXPECT_EQ(r.status, 2);
}

TEST(Cli, HelpExplainsEveryCommand) {
  const CliRun r = run_anvil("--help", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("hw"), std::string::npos);
  EXPECT_NE(r.out.find("bench"), std::string::npos);
  const CliRun g = run_anvil("bench gemm --help", false);
  EXPECT_EQ(g.status, 0);
  for (const char* flag :
       {"--preset", "--sizes", "--dtype", "--threads", "--baselines", "--json", "--csv"}) {
    EXPECT_NE(g.out.find(flag), std::string::npos) << flag;
  }
  EXPECT_EQ(g.out.find("--internal-raw-blas"), std::string::npos) << "internal flag is hidden";
}

TEST(Cli, HwJsonDescribesCpuBlasAndMpi) {
  const CliRun r = run_anvil("hw --json", false);
  ASSERT_EQ(r.status, 0);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["cpu"]["logical_cpus"].get<int>(), 0);
  EXPECT_TRUE(j["isa"].contains("avx512_bf16"));
  EXPECT_FALSE(j["blas"]["corename"].get<std::string>().empty());
  EXPECT_NE(j["mpi"].get<std::string>().find("MPI"), std::string::npos);
}

TEST(Cli, GemmBenchMeasuresTheLibraryBaselineInAChildAndWritesJson) {
  const auto out = std::filesystem::temp_directory_path() /
                   ("anvil-cli-" + std::to_string(::getpid()) + ".json");
  const CliRun r = run_anvil(
      "bench gemm --sizes 16,32 --baselines library --min-time 0.001 --csv --out " + out.string(),
      false);
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("shape,MxNxK,op,dtype,thr,GFLOP/s,best,%peak,library GF/s,x library", 0),
            0u)
      << r.out;
  const auto j = nlohmann::json::parse(std::ifstream(out));
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_TRUE(j["rows"][0]["baselines_gflops"].contains("library"));
  EXPECT_NE(j["baselines"]["library"].get<std::string>().find("library's own detection"),
            std::string::npos);
  std::filesystem::remove(out);
}

TEST(Cli, SeveralChildBaselinesEachAnswerAndExit) {
  // Each child must see end-of-file on its stdin when the run ends, even
  // though later children were started while it was open.
  const CliRun r = run_anvil(
      "bench gemm --sizes 8,16 --baselines library,coretype:Haswell,coretype:Prescott "
      "--min-time 0.001 --json",
      false);
  ASSERT_EQ(r.status, 0);
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& row : j["rows"]) {
    for (const char* b : {"library", "coretype:Haswell", "coretype:Prescott"}) {
      EXPECT_TRUE(row["baselines_gflops"].contains(b)) << b;
    }
  }
  EXPECT_NE(j["baselines"]["coretype:Prescott"].get<std::string>().find("Prescott kernels"),
            std::string::npos);
}

TEST(Cli, UnknownBaselineIsAUsageError) {
  expect_usage_error("bench gemm --baselines mkl", "--baselines");
}

TEST(Cli, CommBenchRunsUnderMpirunAndChecksExactly) {
  const CliRun r = run_anvil(
      "bench comm --np 2 --op allreduce,allgather,broadcast -b 8 -e 64K -f 16 -n 2 -w 1 --json",
      false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ranks"], 2);
  ASSERT_FALSE(j["points"].empty());
  for (const auto& p : j["points"]) EXPECT_EQ(p["wrong"], 0) << p.dump();
  EXPECT_FALSE(j["fits"].empty());
}

TEST(Cli, CommBenchPassesPoolEachSizeIntoOnePoint) {
  // Three sweeps over the sizes give one checked point per (op, algo, size),
  // the same points a single sweep gives.
  auto keys = [](const std::string& passes) {
    const CliRun r = run_anvil(
        "bench comm --np 2 --op allreduce,reduce_scatter --algo shm,ring "
        "-b 1K -e 64K -f 4 -n 2 -w 1 --json --passes " +
            passes,
        false);
    EXPECT_EQ(r.status, 0) << r.out;
    std::vector<std::string> out;
    const auto j = nlohmann::json::parse(r.out);
    for (const auto& p : j["points"]) {
      EXPECT_EQ(p["wrong"], 0) << p.dump();
      EXPECT_GT(p["p50_us"].get<double>(), 0.0) << p.dump();
      out.push_back(p["op"].get<std::string>() + "/" + p["algo"].get<std::string>() + "/" +
                    std::to_string(p["bytes"].get<int64_t>()));
    }
    return out;
  };
  const auto one = keys("1");
  EXPECT_EQ(one.size(), 2u * 3u * 4u);  // 2 ops x (mpi, shm, ring) x 1K..64K by 4
  EXPECT_EQ(keys("3"), one);
  expect_usage_error("bench comm --passes 0", "--passes");
}

TEST(Cli, CommBenchAddsSizesAndRefinesOnlyInsideTheSweep) {
  // --add-sizes joins the sweep (sorted in, checked like the rest); --refine
  // may add sizes only strictly between two swept ones, whatever the timings.
  const CliRun r = run_anvil(
      "bench comm --np 2 --op allreduce --algo ring -b 4K -e 64K -f 4 -n 2 -w 1 --json "
      "--add-sizes 24K,6000 --refine 1.01",
      false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  std::vector<int64_t> ring;
  for (const auto& p : j["points"]) {
    EXPECT_EQ(p["wrong"], 0) << p.dump();
    if (p["algo"] == "ring") ring.push_back(p["bytes"].get<int64_t>());
  }
  ASSERT_TRUE(std::is_sorted(ring.begin(), ring.end()));
  for (int64_t b : {4096, 6000, 16384, 24576, 65536})
    EXPECT_NE(std::find(ring.begin(), ring.end(), b), ring.end()) << b;
  EXPECT_EQ(ring.front(), 4096);
  EXPECT_EQ(ring.back(), 65536);
  for (int64_t b : ring) EXPECT_EQ(b % 4, 0) << b;  // whole f32 elements
  expect_usage_error("bench comm --refine 0.5", "--refine");
  expect_usage_error("bench comm --add-sizes 1Q", "--add-sizes");
}

TEST(Cli, CommBenchWithALatePeerReportsTheWaitersCpuAndTheComputeSlowdown) {
  const CliRun r = run_anvil(
      "bench comm --np 2 --op allreduce,allgather --algo shm -b 64K -e 1M -f 16 -n 3 -w 1 "
      "--late-peer 5 --json",
      false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["late_peer_ms"], 5.0);
  EXPECT_GE(j["compute_threads"].get<int>(), 1);
  ASSERT_EQ(j["points"].size(), 2u * 2u * 2u);  // 2 ops x (mpi, shm) x 64K, 1M
  for (const auto& p : j["points"]) {
    EXPECT_EQ(p["wrong"], 0) << p.dump();
    EXPECT_GT(p["p50_us"].get<double>(), 0.0) << p.dump();
    const double cpu = p["wait_cpu"];
    EXPECT_GE(cpu, 0.0) << p.dump();
    EXPECT_LE(cpu, 1.05) << p.dump();  // one thread: at most one CPU second per second
    // Fractions of the reference rate lost (negative: the calls' windows
    // ran faster): at most all of it; how much is the host's to decide.
    for (const char* key : {"compute_slowdown", "wait_slowdown"}) {
      const double slowdown = p[key];
      EXPECT_TRUE(std::isfinite(slowdown)) << key << " " << p.dump();
      EXPECT_LE(slowdown, 1.0) << key << " " << p.dump();
    }
  }
  // Without --late-peer, no such fields.
  const CliRun plain =
      run_anvil("bench comm --np 2 --algo shm -b 1K -e 1K -n 1 -w 0 --json", false);
  ASSERT_EQ(plain.status, 0) << plain.out;
  const auto pj = nlohmann::json::parse(plain.out);
  EXPECT_FALSE(pj.contains("late_peer_ms"));
  EXPECT_FALSE(pj["points"][0].contains("wait_cpu"));
  expect_usage_error("bench comm --late-peer 20000", "--late-peer");
  expect_usage_error("bench comm --late-peer 5 -b 1K -e 1K", "--late-peer");  // one rank
}

TEST(Cli, AttentionBenchReportsEachCaseAgainstTheSgemmPeak) {
  const CliRun r = run_anvil(
      "bench attention --seqs 130,64 --head-dims 16 --heads 4 --kv-heads 2 --tokens 260 "
      "--min-time 0.001 --json",
      false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["benchmark"], "attention");
  EXPECT_GT(j["sgemm_peak_gflops"].get<double>(), 0.0);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["seq"], 130);
  EXPECT_EQ(j["rows"][0]["batch"], 2);  // 260 tokens / 130
  EXPECT_EQ(j["rows"][0]["kv_heads"], 2);
  for (const auto& row : j["rows"]) {
    const double total = row["total_gflops"].get<double>();
    EXPECT_GT(total, 0.0) << row.dump();
    EXPECT_NEAR(row["pct_of_sgemm_peak"].get<double>(),
                100.0 * total / j["sgemm_peak_gflops"].get<double>(), 1e-9);
  }
  expect_usage_error("bench attention --heads 4 --kv-heads 3", "--kv-heads");
  expect_usage_error("bench attention --seqs 0", "--seqs");
}

TEST(Cli, CommBenchWritesTheAutoTuningTable) {
  const auto out = std::filesystem::temp_directory_path() /
                   ("anvil-tune-" + std::to_string(::getpid()) + ".json");
  const CliRun r =
      run_anvil("bench comm --np 2 --op allreduce -b 8 -e 1K -f 8 -n 1 -w 0 --csv --tuning-out " +
                    out.string(),
                false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j["format"], "anvil-comm-tuning");
  ASSERT_FALSE(j["rows"].empty());
  EXPECT_EQ(j["rows"][0]["op"], "allreduce");
  EXPECT_EQ(j["rows"][0]["ranks"], 2);
  std::filesystem::remove(out);
}

TEST(Cli, CommBenchRejectsBadFlags) {
  expect_usage_error("bench comm --op allsum", "--op");
  expect_usage_error("bench comm --algo magic", "--algo");
  expect_usage_error("bench comm -b 1X", "--minbytes");
  expect_usage_error("bench comm -b 1M -e 1K", "-b/-e");
  expect_usage_error("bench comm --dtype i32 --redop avg", "--redop avg");
  expect_usage_error("bench comm --root 5", "--root");
}

TEST(Cli, AStuckRankEndsTheJobWithinTheTimeoutNamingOpAndRanks) {
  // --stall-rank 1: rank 1 never joins; ranks 0 and 2 must each say so.
  for (const std::string algo : {"ring", "shm", "mpi"}) {
    const CliRun r = run_anvil(
        "bench comm --np 3 --algo " + algo + " -b 1K -e 1K -n 2 -w 1 --timeout 2 --stall-rank 1",
        true);
    // The stalled rank sleeps 3 x timeout + 10 s; a job that instead ended
    // only when it woke would not carry these lines from the waiting ranks.
    EXPECT_NE(r.status, 0) << algo;
    for (const std::string rank : {"rank 0: ", "rank 2: "}) {
      const std::string what = algo == "mpi" ? "allreduce(mpi) did not finish within 2 s"
                                             : "allreduce(" + algo + ") timed out after 2 s";
      EXPECT_NE(r.out.find(rank + what), std::string::npos) << algo << ":\n" << r.out;
    }
    if (algo != "mpi") {
      EXPECT_NE(r.out.find("rank(s) 1 did not arrive"), std::string::npos) << r.out;
    }
  }
}

TEST(Cli, MembwCsvHasOneRowPerMeasurement) {
  const CliRun r = run_anvil(
      "bench membw --kernels triad,read --sizes 16K,64K --threads 1 --min-time 0.001 --csv", false);
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1 + 4) << r.out;
}

TEST(Cli, HwProfileWritesALoadableProfile) {
  const auto out = std::filesystem::temp_directory_path() /
                   ("anvil-prof-" + std::to_string(::getpid()) + ".json");
  const CliRun r = run_anvil("hw --profile " + out.string() + " --min-time 0.001", false);
  ASSERT_EQ(r.status, 0);
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j["format"], "anvil-hw-profile");
  EXPECT_EQ(j["origin"], "measured");
  EXPECT_FALSE(j["peak"].empty());
  EXPECT_FALSE(j["memory_levels"].empty());
  EXPECT_FALSE(j["attention"].empty());
  // The model's GEMM shapes measured into it; the planner then prices them as measured.
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  ASSERT_EQ(run_anvil("bench gemm --preset model --config " + cfg +
                          " --tokens 64 --backward --min-time 0.001 --baselines none --profile " +
                          out.string(),
                      false)
                .status,
            0);
  const auto k = nlohmann::json::parse(std::ifstream(out));
  EXPECT_FALSE(k["gemm_shapes"].empty());
  const CliRun p = run_anvil(
      "plan --config " + cfg + " --hw " + out.string() + " --micro-batch 1 --seq 64 --dtype f32",
      false);
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("(measured shape)"), std::string::npos) << p.out;
  std::filesystem::remove(out);
}

}  // namespace

TEST(Cli, PlanAndSizeRejectBadInputWithOneLine) {
  const std::string zaya = std::string(ANVIL_SOURCE_DIR) + "/configs/zaya1-base.json";
  const std::string gpt2 = std::string(ANVIL_SOURCE_DIR) + "/configs/gpt2-124m.json";
  expect_usage_error("plan --config " + zaya + " --hw tpu-v9", "tpu-v9");
  expect_usage_error("plan --config " + zaya + " --hw /nonexistent.json", "/nonexistent.json");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --global-batch 3", "--global-batch");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x --ep 2", "--ep");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x --accum 4 --global-batch 8",
                     "--accum 4");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x --threads-per-rank 4",
                     "--threads-per-rank");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x --expert-loads /nonexistent",
                     "has no experts");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x -T 8192", "learned positions");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --ep 3", "--ep");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --dtype int4", "--dtype");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --assume memory=2", "--assume");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --assume hbm=0.5", "--assume");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x --dp 1 --tp 5", "--tp");
  expect_usage_error("plan --config " + gpt2 + " --hw mi300x --seq 1000 --dp 1 --cp 3", "--cp");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --expert-loads /nonexistent",
                     "--expert-loads");
  expect_usage_error("plan --config " + zaya + " --hw mi300x --set n_layers=0", "n_layers");
  expect_usage_error("plan --hw mi300x", "--config");
  expect_usage_error("size --config " + zaya + " --recommend", "--recommend");
  expect_usage_error("plan comm --hw mi300x --op gather", "--op");
  expect_usage_error("plan comm --hw mi300x --sizes 12Q", "--sizes");
}

TEST(Cli, PlanPredictsAStepAndSizeChecksTheRules) {
  const std::string zaya = std::string(ANVIL_SOURCE_DIR) + "/configs/zaya1-base.json";
  const CliRun p = run_anvil("plan --config " + zaya +
                                 " --hw mi300x --nodes 2 --zero --global-batch 32 --seq 4096 "
                                 "--mttf-hours 20000 --json",
                             false);
  ASSERT_EQ(p.status, 0) << p.out;
  const auto j = nlohmann::json::parse(p.out);
  EXPECT_GT(j["step_s"].get<double>(), 0);
  EXPECT_EQ(j["layout"]["dp"], 16);
  EXPECT_EQ(j["layout"]["accumulation"], 2);
  EXPECT_GT(j["reliability"]["goodput"].get<double>(), 0);
  EXPECT_EQ(j["comm"].size(), 2u);  // reduce-scatter + all-gather (ZeRO-1)

  const CliRun s =
      run_anvil("size --config " + zaya + " --hw mi300x --recommend --top 3 --json", false);
  ASSERT_EQ(s.status, 0) << s.out;
  const auto k = nlohmann::json::parse(s.out);
  EXPECT_EQ(k["parameters"]["non_embedding_total"], 8303355728);
  EXPECT_GT(k["rules"].size(), 10u);
  // The top 3, then the Pareto front and the given shape wherever they rank.
  const auto& rec = k["recommend"];
  ASSERT_GE(rec.size(), 3u);
  bool front = false, given = false;
  for (size_t i = 0; i < rec.size(); ++i) {
    if (i < 3) {
      EXPECT_EQ(rec[i]["rank"], i + 1);
    } else {
      EXPECT_TRUE(rec[i]["pareto"].get<bool>() || rec[i]["change"] == "as given");
    }
    front = front || rec[i]["pareto"].get<bool>();
    given = given || rec[i]["change"] == "as given";
    EXPECT_GT(rec[i]["decode_b32_s"].get<double>(), rec[i]["decode_b1_s"].get<double>());
  }
  EXPECT_TRUE(front);
  EXPECT_TRUE(given);
  const CliRun st = run_anvil("size --config " + zaya + " --hw mi300x --recommend --top 3", false);
  ASSERT_EQ(st.status, 0) << st.out;
  EXPECT_NE(st.out.find("# Pareto front"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("as given: training rank"), std::string::npos) << st.out;

  // Tensor, pipeline and context parallel in fp8, and a derating override.
  const std::string llama = std::string(ANVIL_SOURCE_DIR) + "/bench/published/llama3-70b.json";
  const std::string layout = "plan --config " + llama +
                             " --hw h100-sxm --dtype fp8 --seq 8192 --global-batch 128 --dp 2 "
                             "--tp 4 --pp 4 --vp 5 --cp 2 --zero --json";
  const CliRun tp = run_anvil(layout, false);
  ASSERT_EQ(tp.status, 0) << tp.out;
  const auto t = nlohmann::json::parse(tp.out);
  EXPECT_EQ(t["layout"]["world"], 64);
  EXPECT_EQ(t["layout"]["nodes"], 8);
  bool bubble = false;
  for (const auto& part : t["compute"]) bubble = bubble || part["name"] == "pipeline bubble";
  EXPECT_TRUE(bubble);
  const CliRun slow = run_anvil(layout + " --assume gemm.fp8=0.3 --assume memory=0.5", false);
  ASSERT_EQ(slow.status, 0) << slow.out;
  EXPECT_GT(nlohmann::json::parse(slow.out)["step_s"].get<double>(), t["step_s"].get<double>());
  // The same two assumptions comma-separated.
  const CliRun slow_commas = run_anvil(layout + " --assume gemm.fp8=0.3,memory=0.5", false);
  ASSERT_EQ(slow_commas.status, 0) << slow_commas.out;
  EXPECT_EQ(nlohmann::json::parse(slow_commas.out)["step_s"],
            nlohmann::json::parse(slow.out)["step_s"]);

  const CliRun c = run_anvil("plan comm --hw h100-sxm --ranks 16 --sizes 1M,1G --json", false);
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(nlohmann::json::parse(c.out).size(), 2u);
}

TEST(Cli, TrainsZaya1WithRouterLossesAndGeneratesFromItsCheckpoint) {
  const std::string dir = fresh_dir("cli_zaya");
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 300; ++i) text << "in the beginning was the word " << i << "\n";
  }
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/zaya-tiny.json";
  const CliRun t =
      run_anvil("train --config " + cfg + " --set vocab_size=256 --data " + dir +
                    "/text.txt -B 2 -T 16 --steps 3 --peak-gflops 1 --aux-loss-coef 0.01 "
                    "--z-loss-coef 0.001 --out " +
                    dir + "/run",
                false);
  ASSERT_EQ(t.status, 0) << t.out;
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const auto router = nlohmann::json::parse(line)["router"];
  ASSERT_FALSE(router.empty());
  EXPECT_GT(router[0]["aux_loss"].get<double>(), 0);
  EXPECT_GT(router[0]["z_loss"].get<double>(), 0);
  const CliRun g =
      run_anvil("generate --checkpoint " + dir + "/run --prompt in --max-new 8", false);
  ASSERT_EQ(g.status, 0);
  EXPECT_EQ(g.out.size(), std::string("in").size() + 8 + 1);  // prompt, 8 bytes, newline
}

TEST(Cli, ExportsAndImportsCheckpointsInTheHuggingFaceLayouts) {
  const std::string dir = fresh_dir("cli_export");
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/zaya-tiny.json";
  ASSERT_EQ(run_anvil("train --config " + cfg + " -B 1 -T 16 --steps 1 --peak-gflops 1 --out " +
                          dir + "/run",
                      false)
                .status,
            0);
  // The skip class outputs gate * x here: transformers' layout cannot say so.
  expect_usage_error("ckpt export --hf --checkpoint " + dir + "/run --out " + dir + "/hf",
                     "skip_output");
  EXPECT_FALSE(std::filesystem::exists(dir + "/hf"));
  // An interrupted export's temporary (its process gone) is removed by the next.
  std::filesystem::create_directories(dir + "/.orig.tmp-999999999");
  std::ofstream(dir + "/.orig.tmp-999999999/model-00001-of-00002.safetensors") << "half";
  const CliRun e = run_anvil(
      "ckpt export --format original --checkpoint " + dir + "/run --out " + dir + "/orig", true);
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/.orig.tmp-999999999"));
  const auto config = nlohmann::json::parse(std::ifstream(dir + "/orig/config.json"));
  EXPECT_EQ(config["model_type"], "zaya");
  EXPECT_EQ(config["num_experts"], 3);
  EXPECT_EQ(config["router_hidden_size"], 16);
  // The weights: every section-7 name (balancing biases too), no optimizer state.
  std::ifstream f(dir + "/orig/model.safetensors", std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const auto h = nlohmann::json::parse(header);
  EXPECT_TRUE(h.contains("model.embed_tokens.weight"));
  EXPECT_TRUE(h.contains("model.layers.1.zaya_block.router.balancing_biases"));
  EXPECT_TRUE(h.contains("model.layers.1.zaya_block.experts.local_experts.2.linear_fc1.weight"));
  EXPECT_TRUE(h.contains("model.layers.0.self_attn.qkv.conv_qk.1.weight"));
  for (const auto& [name, v] : h.items()) EXPECT_EQ(name.find("exp_avg"), std::string::npos);
  // Again into the same place: refused, nothing half-written.
  expect_usage_error(
      "ckpt export --format original --checkpoint " + dir + "/run --out " + dir + "/orig", "--out");
  // The original layout imports back to the same weights.
  ASSERT_EQ(run_anvil("ckpt import --hf " + dir + "/orig --out " + dir + "/back", true).status, 0);
  EXPECT_EQ(run_anvil("ckpt verify " + dir + "/back", true).status, 0);
  const auto a = nlohmann::json::parse(std::ifstream(dir + "/back/model-config.json"));
  EXPECT_EQ(a["n_experts"], 3);
  // Zyphra's own files (no anvil config): the original model's skip output,
  // gate * x, and the import says so.
  std::filesystem::create_directories(dir + "/zyphra");
  auto zyphra = nlohmann::json::parse(std::ifstream(dir + "/orig/config.json"));
  zyphra.erase("anvil");
  std::ofstream(dir + "/zyphra/config.json") << zyphra.dump();
  for (const auto& file : std::filesystem::directory_iterator(dir + "/orig"))
    if (file.path().extension() == ".safetensors")
      std::filesystem::copy_file(file.path(),
                                 std::filesystem::path(dir + "/zyphra") / file.path().filename());
  const CliRun z = run_anvil("ckpt import --hf " + dir + "/zyphra --out " + dir + "/zback", true);
  ASSERT_EQ(z.status, 0) << z.out;
  EXPECT_NE(z.out.find("the skip class outputs gate * x"), std::string::npos) << z.out;
  const auto zc = nlohmann::json::parse(std::ifstream(dir + "/zback/model-config.json"));
  EXPECT_FALSE(zc.contains("skip_output")) << zc.dump();  // input, the default
  // Llama with partial RoPE has no transformers architecture.
  const std::string llama = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/llama-tiny.json";
  ASSERT_EQ(run_anvil("train --config " + llama + " -B 1 -T 16 --steps 1 --peak-gflops 1 --out " +
                          dir + "/dense",
                      false)
                .status,
            0);
  expect_usage_error("ckpt export --checkpoint " + dir + "/dense --out " + dir + "/x",
                     "rotary_dim 8");
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
  expect_usage_error("ckpt export --hf --checkpoint /nonexistent --out " + dir + "/y",
                     "/nonexistent");
  expect_usage_error("ckpt export --checkpoint " + dir + "/run --out " + dir + "/y --dtype f8",
                     "--dtype");
  // Import: a tensor missing from the file is named.
  std::filesystem::create_directories(dir + "/broken");
  std::filesystem::copy_file(dir + "/orig/config.json", dir + "/broken/config.json");
  std::ofstream(dir + "/broken/model.safetensors", std::ios::binary)
      << std::string("\x08\0\0\0\0\0\0\0{}      ", 16);  // no tensors
  expect_usage_error("ckpt import --hf " + dir + "/broken --out " + dir + "/z",
                     "model.embed_tokens.weight is missing");
  EXPECT_FALSE(std::filesystem::exists(dir + "/z/step-00000000"));
  expect_usage_error("ckpt frobnicate", "frobnicate");
}

namespace {

// Every file under `dir` with its contents: equal snapshots, nothing written
// or deleted.
std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    files[std::filesystem::relative(e.path(), dir).string()] =
        e.is_regular_file() ? std::string(std::istreambuf_iterator<char>(in), {}) : "<dir>";
  }
  return files;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A token file (docs/train.md's format) of 2-byte ids.
std::string token_file(uint64_t vocab, const std::vector<uint16_t>& ids) {
  std::string header(64, '\0');
  header.replace(0, 8, "ANVILTOK");
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) header[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(8, 1, 4);
  put(12, 2, 4);
  put(16, vocab, 8);
  put(24, ids.size(), 8);
  return header + std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
}

// A safetensors file from a header text and `data_bytes` zero bytes of data.
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string safetensors(const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + std::string(data_bytes, '\0');
}

}  // namespace

TEST(Cli, BadTokenFilesCheckpointsAndStateJsonAreOneLineStatus2AndWriteNothing) {
  const std::string dir = fresh_dir("cli_bad_inputs");
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 100; ++i) text << "a small corpus, line " << i << "\n";
  }
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  const std::string train =
      "train --config " + cfg + " --set vocab_size=256 -B 2 -T 16 --peak-gflops 1 --data ";

  // Token files: an id past the header's vocabulary; a vocabulary past the model's.
  std::vector<uint16_t> ids(3000, 5);
  ids[2047] = 256;
  write_bytes(dir + "/bad.tok", token_file(256, ids));
  expect_usage_error(train + dir + "/bad.tok --steps 2 --out " + dir + "/never",
                     dir + "/bad.tok: token 256 at position 2047");
  ids[2047] = 5;
  write_bytes(dir + "/wide.tok", token_file(300, ids));
  expect_usage_error(train + dir + "/wide.tok --steps 2 --out " + dir + "/never",
                     dir + "/wide.tok: vocabulary 300 exceeds the model's vocab_size 256");
  EXPECT_FALSE(std::filesystem::exists(dir + "/never"));

  // A checkpoint, then copies of it with one file corrupted each.
  ASSERT_EQ(run_anvil(train + dir + "/text.txt --steps 2 --out " + dir + "/run", false).status, 0);
  const std::string emb = "model.embed_tokens.weight";
  auto entry = [&](const std::string& shape, int begin, int end) {
    return "\"" + emb + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  struct Case {
    std::string file, contents, problem;
  };
  const std::vector<Case> cases = {
      {"state.json", "{\"format\": \"anvil-train-state\", \"step\": 2, \"con", "not valid JSON"},
      {"state.json", "{\"format\": \"anvil-train-state\", \"step\": \"two\"}", "step is \"two\""},
      {"model.safetensors", safetensors("{" + entry("[-4,4]", 0, 64) + "}", 64),
       "tensor " + emb + ": shape [-4,4]: dimension -4 is negative"},
      {"model.safetensors", safetensors("{" + entry("[4611686018427387904,4]", 0, 0) + "}", 0),
       "tensor " + emb + ": shape [4611686018427387904,4] of F32 overflows"},
      {"model.safetensors",
       safetensors("{" + entry("[4]", 0, 16) + ",\"__metadata__\":{\"version\":1}}", 16),
       "__metadata__: version is 1 (expected a string)"},
      {"model.safetensors",
       safetensors("{" + entry("[4]", 0, 16) + "," + entry("[4]", 16, 32) + "}", 32),
       "tensor " + emb + ": named twice"},
      {"model.safetensors",
       safetensors("{" + entry("[4]", 0, 16) + ",\"b\":{\"dtype\":\"F32\",\"shape\":[4]," +
                       "\"data_offsets\":[8,24]}}",
                   24),
       "tensor b: data_offsets [8, 24] overlap tensor " + emb + "'s [0, 16]"},
      {"model.safetensors", safetensors("{" + entry("[4]", 16, 0) + "}", 16),
       "tensor " + emb + ": data_offsets [16, 0]: end before begin"},
      {"model.safetensors", safetensors("{" + entry("[4,4]", 0, 32) + "}", 32),
       "tensor " + emb + ": data_offsets [0, 32]: 32 bytes (expected 64 for F32 [4,4])"},
  };
  // The safetensors cases go into a version-1 checkpoint (model.safetensors
  // and state.json); the others into the sharded one the run wrote.
  const std::string index = slurp(dir + "/run/step-00000002/index.json");
  std::string shard = slurp(dir + "/run/step-00000002/rank-00000.safetensors");
  // Damage the first tensor's data (model weights come first; generation
  // reads only those).
  size_t data_start = 8;
  for (int i = 0; i < 8; ++i)
    data_start += static_cast<size_t>(static_cast<unsigned char>(shard[i])) << (8 * i);
  std::string flipped = shard;
  flipped[data_start + 3] ^= 0x40;
  const std::vector<Case> sharded_cases = {
      {"rank-00000.safetensors", flipped, "checksum mismatch"},
      {"rank-00000.safetensors", shard.substr(0, data_start + 16), "beyond the file's"},
      {"index.json", index.substr(0, index.size() / 2), "not valid JSON"},
      {"index.json",
       "{\"format\": \"anvil-checkpoint\", \"version\": 2, \"step\": 2, \"world\": 1, \"tensors\": "
       "{}}",
       "index.json: tensor model.embed_tokens.weight [256, 48]: missing"},
  };
  std::vector<Case> all = cases;
  all.insert(all.end(), sharded_cases.begin(), sharded_cases.end());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& c = all[i];
    const std::string run = dir + "/bad" + std::to_string(i);
    std::filesystem::copy(dir + "/run", run, std::filesystem::copy_options::recursive);
    const std::string step = run + "/step-00000002/";
    if (c.file == "model.safetensors") {
      std::filesystem::remove(step + "index.json");
      std::filesystem::remove(step + "rank-00000.safetensors");
    }
    const std::string path = step + c.file;
    write_bytes(path, c.contents);
    const auto before = snapshot(run);
    expect_usage_error(train + dir + "/text.txt --steps 4 --out " + run + " --resume latest",
                       path + ": ");
    expect_usage_error(train + dir + "/text.txt --steps 4 --out " + run + " --resume latest",
                       c.problem);
    expect_usage_error("generate --checkpoint " + run + " --prompt hi --max-new 2", path + ": ");
    expect_usage_error("generate --checkpoint " + run + " --prompt hi --max-new 2", c.problem);
    EXPECT_EQ(snapshot(run), before) << c.problem;
  }
}

TEST(Cli, TrainsATokenizerAndARunThatSpeaksThroughIt) {
  const std::string dir = fresh_dir("cli_tokenizer");
  const std::string text = std::string(ANVIL_SOURCE_DIR) + "/README.md";
  ASSERT_EQ(
      run_anvil("data tokenizer train --text " + text + " --vocab 600 --out " + dir + "/tk", true)
          .status,
      0);
  const CliRun t = run_anvil("data tokenize --text " + text + " --tokenizer " + dir +
                                 "/tk.model --out " + dir + "/readme.tok --verify",
                             true);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("decoded back exactly"), std::string::npos) << t.out;
  const auto meta = nlohmann::json::parse(std::ifstream(dir + "/readme.tok.json"));
  EXPECT_EQ(meta["tokenizer"]["kind"], "sentencepiece");
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/gpt2-tiny.json";
  ASSERT_EQ(run_anvil("train --config " + cfg + " --set vocab_size=600 -B 2 -T 32 --steps 2 " +
                          "--peak-gflops 1 --data " + dir + "/readme.tok --out " + dir + "/run",
                      false)
                .status,
            0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/tokenizer.model"));
  // The prompt is encoded and the sample decoded with the run's tokenizer.
  const CliRun g = run_anvil(
      "generate --checkpoint " + dir + "/run --prompt 'The anvil' --max-new 5 --temperature 0",
      false);
  ASSERT_EQ(g.status, 0);
  EXPECT_EQ(g.out.rfind("The anvil", 0), 0u) << g.out;
  EXPECT_GT(g.out.size(), std::string("The anvil\n").size());
  // A vocabulary too small for the token file is refused by name.
  expect_usage_error(
      "train --config " + cfg + " -B 2 -T 32 --steps 1 --data " + dir + "/readme.tok",
      "readme.tok");
  expect_usage_error(
      "data tokenize --text " + text + " --tokenizer " + text + " --out " + dir + "/x.tok",
      "not a SentencePiece model");
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.tok"));
  expect_usage_error("data tokenizer train --text " + text + " --vocab 10 --out " + dir + "/y",
                     "--vocab");
  // eval refuses text or ids of another tokenizer than the run's.
  expect_usage_error("eval --checkpoint " + dir + "/run --data " + text, "tokenized as bytes");
  // So does a resume: its ids would mean other text to the weights, and the
  // run's tokenizer.model would no longer decode its earlier checkpoints.
  expect_usage_error("train --config " + cfg + " --set vocab_size=600 -B 2 -T 32 --steps 3 " +
                         "--peak-gflops 1 --data " + text + " --out " + dir +
                         "/run --resume latest",
                     "is not the one " + dir + "/run/step-00000002 trained with (sentencepiece)");
  // A token file that lost its header is not read as raw text; a mixture
  // weight must be finite.
  std::string headless = anvil::read_file(dir + "/readme.tok");
  headless[0] = 'X';
  anvil::write_file_atomic(dir + "/headless.tok", headless);
  expect_usage_error("train --config " + cfg + " --set vocab_size=600 -B 2 -T 32 --steps 1 " +
                         "--data " + dir + "/headless.tok",
                     "headless.tok: not a token file");
  expect_usage_error("train --config " + cfg + " --set vocab_size=600 -B 2 -T 32 --steps 1 " +
                         "--data " + dir + "/readme.tok:inf," + dir + "/readme.tok:1",
                     "weight in (0, 1e12]");
  // A Hugging Face round trip keeps the tokenizer: the imported run speaks.
  ASSERT_EQ(
      run_anvil("ckpt export --checkpoint " + dir + "/run --out " + dir + "/hf", false).status, 0);
  ASSERT_EQ(run_anvil("ckpt import --hf " + dir + "/hf --out " + dir + "/back", false).status, 0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/back/tokenizer.model"));
  const CliRun b = run_anvil(
      "generate --checkpoint " + dir + "/back --prompt 'The anvil' --max-new 5 --temperature 0",
      false);
  ASSERT_EQ(b.status, 0);
  EXPECT_EQ(b.out, g.out);
}

namespace {

// step -> loss of a run's metrics.jsonl.
std::map<int64_t, double> losses_of(const std::string& run) {
  std::map<int64_t, double> out;
  std::ifstream f(run + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto m = nlohmann::json::parse(line);
    out[m["step"].get<int64_t>()] = m["loss"].get<double>();
  }
  return out;
}

}  // namespace

// Checkpoints are device-neutral: state.json names the device that wrote
// them, and a checkpoint a GPU run wrote (here: the saver's own output with
// the tag a `--device cuda` run puts there) resumes on the CPU on the
// trajectory of the run that never stopped. An unknown device is refused.
// --device cuda refuses, before any work, what its path does not build
// and a machine or binary that cannot run it (this CI machine: no driver,
// or a build without CUDA).
TEST(Cli, TrainOnCudaRefusesWhatItCannotRunWithOneLine) {
  const std::string dir = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/";
  const std::string gpt = " --config " + dir + "gpt2-tiny.json --steps 1";
  expect_usage_error("train --config " + dir + "zaya-tiny.json --device cuda", "zaya1");
  expect_usage_error("train" + gpt + " --device cuda --hw-profile x.json", "--hw-profile");
  expect_usage_error("train" + gpt + " --device tpu", "--device");
  expect_usage_error("train" + gpt + " --tf32", "--tf32");
  if (!anvil::device::cuda_unavailable_reason().empty()) {  // no driver, or no CUDA in the build
    expect_usage_error("train" + gpt + " --device cuda", "--device");
    // before the data is read: the device, not the missing corpus, is said
    expect_usage_error("train" + gpt + " --device cuda --data /nonexistent/corpus.txt", "--device");
  }
}

// A --device cuda plan past the GPU's free memory is refused with one line
// (the check runs before any allocation; here its message).
TEST(Cli, ADevicePlanPastTheGpusFreeMemoryIsOneLine) {
  EXPECT_EQ(anvil::train::device_memory_shortfall(1000, 1000, 0), "");
  const std::string why =
      anvil::train::device_memory_shortfall(size_t{3} << 30, int64_t{1} << 30, 1);
  EXPECT_NE(why.find("model.device: cuda: the memory plan needs 3 GiB on GPU 1, which has "
                     "1 GiB free"),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
}

// gpt2-tiny on 300 numbered lines of `line` in dir/text.txt, a constant
// schedule (a 3-step run is the first half of a 6-step one); append the run
// folder and the steps.
std::string resumable_train(const std::string& dir, const std::string& line) {
  {
    std::ofstream text(dir + "/text.txt");
    for (int i = 0; i < 300; ++i) text << line << " " << i << "\n";
  }
  // Appended piece by piece: GCC 12 warns (-Warray-bounds, wrongly) on one long sum.
  std::string args = "train --config ";
  args += ANVIL_SOURCE_DIR;
  args += "/tests/configs/gpt2-tiny.json --set vocab_size=256 --data ";
  args += dir;
  args += "/text.txt -B 2 -T 16 --schedule constant --peak-gflops 1 --out ";
  args += dir;
  return args;
}

TEST(Cli, ACheckpointWrittenOnAGpuResumesOnTheCpu) {
  const std::string dir = fresh_dir("cli_device");
  const std::string train = resumable_train(dir, "a device-neutral checkpoint");
  ASSERT_EQ(run_anvil(train + "/straight --steps 6", false).status, 0);
  ASSERT_EQ(run_anvil(train + "/gpu --steps 3", false).status, 0);
  const std::string state_path = dir + "/gpu/step-00000003/state.json";
  auto state = nlohmann::json::parse(std::ifstream(state_path));
  EXPECT_EQ(state["device"], "cpu");
  state["device"] = "cuda";
  std::filesystem::copy(dir + "/gpu", dir + "/tpu", std::filesystem::copy_options::recursive);
  // The index keeps a copy of the state (checked against it): both are
  // edited, as a GPU run writes both.
  const auto write_state = [](const std::string& step_dir, const nlohmann::json& s) {
    std::ofstream(step_dir + "/state.json") << s.dump(2);
    auto index = nlohmann::json::parse(std::ifstream(step_dir + "/index.json"));
    index["train_state"] = s;
    std::ofstream(step_dir + "/index.json") << index.dump(1);
  };
  write_state(dir + "/gpu/step-00000003", state);
  const CliRun r = run_anvil(train + "/gpu --steps 6 --resume latest", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint written on cuda, continuing on cpu"), std::string::npos)
      << r.out;
  EXPECT_EQ(losses_of(dir + "/gpu"), losses_of(dir + "/straight"));

  state["device"] = "tpu";
  write_state(dir + "/tpu/step-00000003", state);
  expect_usage_error(train + "/tpu --steps 6 --resume latest",
                     "state.json: device is \"tpu\" (expected \"cpu\" or \"cuda\")");
}

// One process steps on the device (optim/device_adamw.hpp); its moments
// reach the checkpoint through the host mirror and go back up on resume.
// ANVIL_CPU_MODEL=device runs that path on the CPU device.
// AdamW's moments and Muon's momentum go through the host mirrors to the
// checkpoint and back up to the device on resume: the straight run's bits.
TEST(Cli, TheDeviceStepResumesOnTheStraightRunsLosses) {
  for (const std::string optimizer : {"adamw", "muon"}) {
    const std::string dir = fresh_dir("cli_device_step_" + optimizer);
    const std::string train = resumable_train(dir, "moments on the device");
    const std::string opt = " --optimizer " + optimizer;
    ::setenv("ANVIL_CPU_MODEL", "device", 1);
    const int straight = run_anvil(train + "/straight --steps 6" + opt, false).status;
    const int first = run_anvil(train + "/part --steps 3" + opt, false).status;
    const CliRun resumed = run_anvil(train + "/part --steps 6 --resume latest" + opt, false);
    ::unsetenv("ANVIL_CPU_MODEL");
    ASSERT_EQ(straight, 0) << optimizer;
    ASSERT_EQ(first, 0) << optimizer;
    ASSERT_EQ(resumed.status, 0) << optimizer << ": " << resumed.out;
    EXPECT_EQ(losses_of(dir + "/part"), losses_of(dir + "/straight")) << optimizer;
  }
}

// A phase whose data moves the loss for good (one repeated word, learnt to
// ~0, then random bytes at ~ln 256) starts the spike guard afresh: the
// previous phase's losses would call its first steps spikes, skip them and
// stop the run (exit 11) at the boundary.
TEST(Cli, ARecipePhaseStartsTheSpikeGuardAfresh) {
  const std::string dir = fresh_dir("cli_recipe_guard");
  std::string same, noise;
  for (int i = 0; i < 4000; ++i) same += "abab ";
  std::mt19937 gen(3);
  for (int i = 0; i < 20000; ++i) noise += static_cast<char>(gen() % 256);
  write_bytes(dir + "/same.txt", same);
  write_bytes(dir + "/noise.txt", noise);
  const nlohmann::json recipe = {
      {"config", std::string(ANVIL_SOURCE_DIR) + "/tests/configs/llama-tiny.json"},
      {"set", {"vocab_size=256"}},
      {"sources", {{"same", dir + "/same.txt"}, {"noise", dir + "/noise.txt"}}},
      {"seed", 7},
      {"lr", 1e-2},
      {"batch", 2},
      {"phases",
       {{{"name", "same"}, {"tokens", 2 * 32 * 30}, {"seq", 32}, {"mixture", {{"same", 1}}}},
        {{"name", "noise"}, {"tokens", 2 * 32 * 5}, {"seq", 32}, {"mixture", {{"noise", 1}}}}}}};
  write_bytes(dir + "/recipe.json", recipe.dump(2));
  const CliRun r = run_anvil(
      "train --peak-gflops 1 --recipe " + dir + "/recipe.json --out " + dir + "/run", true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("spikes above"), std::string::npos) << r.out;
}

TEST(Cli, RecipeRunsItsPhasesAndResumesMidPhaseOnTheSameLosses) {
  const std::string dir = fresh_dir("cli_recipe");
  const std::string src = ANVIL_SOURCE_DIR;
  ASSERT_EQ(
      run_anvil("data tokenize --text " + src + "/README.md --out " + dir + "/prose.tok", true)
          .status,
      0);
  ASSERT_EQ(run_anvil("data tokenize --text " + src + "/src/anvil/train/trainer.cpp --out " + dir +
                          "/code.tok",
                      true)
                .status,
            0);
  // Three phases: a mixture, an anneal with a doubled batch (accum 2), and a
  // context extension (seq 32 -> 64, rope_theta 1e4 -> 1e5).
  const nlohmann::json recipe = {
      {"config", src + "/tests/configs/zaya-tiny.json"},
      {"set", {"vocab_size=256"}},
      {"sources", {{"prose", dir + "/prose.tok"}, {"code", dir + "/code.tok"}}},
      {"seed", 7},
      {"lr", 3e-3},
      {"batch", 2},
      {"ckpt_every", 3},
      {"phases",
       {{{"name", "pretrain"},
         {"tokens", 640},
         {"seq", 32},
         {"warmup", 2},
         {"mixture", {{"prose", 0.7}, {"code", 0.3}}}},
        {{"name", "anneal"},
         {"tokens", 384},
         {"seq", 32},
         {"accum", 2},
         {"mixture", {{"prose", 0.3}, {"code", 0.7}}},
         {"decay_fraction", 1.0}},
        {{"name", "long"},
         {"tokens", 512},
         {"seq", 64},
         {"rope_theta", 1e5},
         {"lr", 1e-3},
         {"mixture", {{"prose", 1}}}}}}};
  std::ofstream(dir + "/recipe.json") << recipe.dump(2);
  const std::string run = "train --peak-gflops 1 --recipe " + dir + "/recipe.json --out " + dir;
  ASSERT_EQ(run_anvil(run + "/straight", false).status, 0);
  const auto straight = losses_of(dir + "/straight");
  ASSERT_EQ(straight.size(), 17u);  // 10 + 3 + 4 steps
  const auto metrics = nlohmann::json::parse([&] {
    std::ifstream f(dir + "/straight/metrics.jsonl");
    std::string last, line;
    while (std::getline(f, line)) last = line;
    return last;
  }());
  EXPECT_EQ(metrics["phase"], "long");
  EXPECT_EQ(metrics["tokens"], 640 + 384 + 512);
  // Killed mid-phase 1 (newest checkpoint step 3) and mid-phase 3 (step 15):
  // resumed, the same loss at every step.
  for (const int kill : {5, 16}) {
    const std::string k = dir + "/killed-" + std::to_string(kill);
    EXPECT_NE(run_anvil(run + "/killed-" + std::to_string(kill) + " --inject kill@" +
                            std::to_string(kill),
                        false)
                  .status,
              0);
    ASSERT_EQ(run_anvil(run + "/killed-" + std::to_string(kill) + " --resume latest", false).status,
              0);
    EXPECT_EQ(losses_of(k), straight) << "killed at step " << kill;
  }
  // Preempted (SIGTERM) right after an interval's checkpoint (step 6) and
  // in phase 1's last step (10): status 143, the recipe stopped before the
  // next phase, and resumed on the same losses.
  for (const int term : {6, 10}) {
    const std::string k = dir + "/term-" + std::to_string(term);
    EXPECT_EQ(
        run_anvil(run + "/term-" + std::to_string(term) + " --inject term@" + std::to_string(term),
                  false)
            .status,
        128 + SIGTERM);
    EXPECT_EQ(losses_of(k).size(), static_cast<size_t>(term));
    EXPECT_TRUE(std::filesystem::exists(k + "/" + anvil::ckpt::checkpoint_name(term))) << term;
    ASSERT_EQ(run_anvil(run + "/term-" + std::to_string(term) + " --resume latest", false).status,
              0);
    EXPECT_EQ(losses_of(k), straight) << "stopped at step " << term;
  }
  // Its phase's budget edited under a run stopped mid-phase (newest
  // checkpoint step 3; pretrain 10 steps -> 9): refused, naming both spans.
  EXPECT_NE(run_anvil(run + "/edited --inject kill@5", false).status, 0);
  nlohmann::json edited = recipe;
  edited["phases"][0]["tokens"] = 576;
  std::ofstream(dir + "/edited.json") << edited.dump();
  expect_usage_error("train --peak-gflops 1 --recipe " + dir + "/edited.json --out " + dir +
                         "/edited --resume latest",
                     "phase 'pretrain' at steps 1..10; this recipe on 1 rank(s) puts it at 1..9");
  // A budget written with an exponent, short of whole steps: read, rounded
  // up, and the banner says both.
  nlohmann::json small = recipe;
  small["phases"] = nlohmann::json::array({recipe["phases"][0]});
  small["phases"][0]["tokens"] = 1e2;  // 2 steps of 2 x 32
  small["phases"][0]["warmup"] = 1;
  std::ofstream(dir + "/small.json") << small.dump();
  const CliRun s = run_anvil(
      "train --peak-gflops 1 --recipe " + dir + "/small.json --out " + dir + "/small", false);
  EXPECT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("128 tokens (budget 100, whole steps)"), std::string::npos) << s.out;
  // Bad recipes: one line naming the file and key.
  nlohmann::json bad = recipe;
  bad["phases"][1]["mixture"] = {{"poetry", 1}};
  std::ofstream(dir + "/bad.json") << bad.dump();
  expect_usage_error("train --recipe " + dir + "/bad.json --out " + dir + "/x",
                     "phases[1].mixture.poetry");
  bad = recipe;
  bad["phases"][1]["name"] = "pretrain";
  std::ofstream(dir + "/bad.json") << bad.dump();
  expect_usage_error("train --recipe " + dir + "/bad.json --out " + dir + "/x",
                     "phases[1].name: 'pretrain' names an earlier phase too");
  bad = recipe;
  bad["phases"][0]["tokenz"] = 5;
  std::ofstream(dir + "/bad.json") << bad.dump();
  expect_usage_error("train --recipe " + dir + "/bad.json --out " + dir + "/x", "tokenz");
  expect_usage_error("train --recipe " + dir + "/recipe.json", "--out");
  // A later phase's data is checked before the first phase trains: named
  // with its phase, nothing written.
  bad = recipe;
  bad["sources"]["code"] = dir + "/missing.tok";
  bad["phases"][0]["mixture"] = {{"prose", 1}};
  std::ofstream(dir + "/bad.json") << bad.dump();
  expect_usage_error("train --recipe " + dir + "/bad.json --out " + dir + "/x",
                     "bad.json: phases[1] ('anneal'): " + dir + "/missing.tok: cannot open");
  EXPECT_FALSE(std::filesystem::exists(dir + "/x/step-00000003"));
}

namespace {

// A PNG's width and height from its IHDR chunk (0 x 0 when not a PNG).
std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string head(24, '\0');
  f.read(head.data(), 24);
  if (!f || head.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return {0, 0};
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(head[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

}  // namespace

TEST(Cli, PlotsARunAndBenchOutputAsPngs) {
  const std::string dir = fresh_dir("cli_plot");
  const std::string cfg = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/zaya-tiny.json";
  ASSERT_EQ(run_anvil("train --config " + cfg + " -B 2 -T 16 --steps 4 --peak-gflops 1 --out " +
                          dir + "/run",
                      false)
                .status,
            0);
  const CliRun p = run_anvil("plot --run " + dir + "/run", false);
  ASSERT_EQ(p.status, 0) << p.out;
  for (const char* png : {"loss.png", "lr.png", "throughput.png", "router.png"}) {
    const auto [w, h] = png_size(dir + "/run/plots/" + png);
    EXPECT_EQ(w, 1100u) << png;
    EXPECT_EQ(h, 620u) << png;
  }
  // A GEMM bench's JSON.
  ASSERT_EQ(
      run_anvil("bench gemm --sizes 64,128 --threads 1 --json --out " + dir + "/gemm.json", false)
          .status,
      0);
  ASSERT_EQ(run_anvil("plot --bench " + dir + "/gemm.json --out " + dir + "/plots", false).status,
            0);
  EXPECT_EQ(png_size(dir + "/plots/gemm.png").first, 1100u);
  // Without --out: a plots/ folder beside the JSON.
  ASSERT_EQ(run_anvil("plot --bench " + dir + "/gemm.json", false).status, 0);
  EXPECT_EQ(png_size(dir + "/plots/gemm.png").first, 1100u);
  // A ZAYA1 run where some expert got no token at every logged step: no
  // load ratio at all, the router plot holds the skip rate.
  std::filesystem::create_directories(dir + "/idle");
  std::ofstream(dir + "/idle/metrics.jsonl")
      << "{\"step\": 1, \"loss\": 5.5, \"lr\": 0.001, \"router\": [{\"layer\": 1, "
         "\"max_over_min\": null, \"skip_rate\": 0.25}]}\n"
         "{\"step\": 2, \"loss\": 5.4, \"lr\": 0.001, \"router\": [{\"layer\": 1, "
         "\"max_over_min\": null, \"skip_rate\": 0.5}]}\n";
  const CliRun idle = run_anvil("plot --run " + dir + "/idle", false);
  ASSERT_EQ(idle.status, 0) << idle.out;
  EXPECT_EQ(png_size(dir + "/idle/plots/router.png").first, 1100u);
  expect_usage_error("plot --run " + dir + "/nothing", "metrics.jsonl");
  std::ofstream(dir + "/other.json") << "{\"benchmark\": \"membw\"}";
  expect_usage_error("plot --bench " + dir + "/other.json", "expected the --json of");
  expect_usage_error("plot", "--run");
}

TEST(Cli, EvalScoresPerplexityAndMultipleChoice) {
  const std::string dir = fresh_dir("cli_eval");
  const std::string src = ANVIL_SOURCE_DIR;
  ASSERT_EQ(
      run_anvil("data tokenize --text " + src + "/README.md --out " + dir + "/readme.tok", true)
          .status,
      0);
  const std::string cfg = src + "/tests/configs/zaya-tiny.json";
  ASSERT_EQ(run_anvil("train --config " + cfg + " --set vocab_size=256 -B 2 -T 32 --steps 3 " +
                          "--peak-gflops 1 --data " + dir + "/readme.tok --out " + dir + "/run",
                      false)
                .status,
            0);
  {
    std::ofstream t(dir + "/task.jsonl");
    t << R"({"context": "1 + 1 =", "choices": [" 2", " 3", " 11"], "gold": 0})"
      << "\n\n"
      << R"({"context": "The King", "choices": [" James", " Arthur"], "gold": 1})"
      << "\n";
  }
  const CliRun e =
      run_anvil("eval --checkpoint " + dir + "/run --data readme=" + dir +
                    "/readme.tok --rows 4 --seq 32 --task " + dir + "/task.jsonl --json",
                false);
  ASSERT_EQ(e.status, 0) << e.out;
  const auto j = nlohmann::json::parse(e.out);
  ASSERT_EQ(j["perplexity"].size(), 1u);
  EXPECT_EQ(j["perplexity"][0]["tokens"], 4 * 32);
  EXPECT_NEAR(j["perplexity"][0]["perplexity"].get<double>(),
              std::exp(j["perplexity"][0]["loss"].get<double>()), 1e-9);
  ASSERT_EQ(j["tasks"].size(), 1u);
  EXPECT_EQ(j["tasks"][0]["questions"], 2);
  const double acc = j["tasks"][0]["acc"].get<double>();
  EXPECT_TRUE(acc == 0 || acc == 0.5 || acc == 1) << acc;
  std::ofstream(dir + "/bad.jsonl") << R"({"context": "x", "choices": ["a"], "gold": 0})"
                                    << "\n";
  expect_usage_error("eval --checkpoint " + dir + "/run --task " + dir + "/bad.jsonl",
                     "bad.jsonl: line 1");
  std::ofstream(dir + "/bad.jsonl") << R"({"context": "x", "choices": ["a", "b"], "gold": 1e33})"
                                    << "\n";
  expect_usage_error("eval --checkpoint " + dir + "/run --task " + dir + "/bad.jsonl",
                     "bad.jsonl: line 1: gold: expected an integer in [0, 1], got 1e+33");
  std::ofstream(dir + "/bad.jsonl") << "{not json\n";
  expect_usage_error("eval --checkpoint " + dir + "/run --task " + dir + "/bad.jsonl",
                     "bad.jsonl: line 1");
  expect_usage_error("eval --checkpoint " + dir + "/run", "--data");
}

// anvil eval and generate through the GPU path's model on the CPU device
// (ANVIL_CPU_MODEL=device) score and decode (greedy, its KV cache) what
// the CPU decoder does; --device cuda where no GPU can be used, or with a
// bad name, is refused in one line.
TEST(Cli, EvalAndGenerateThroughTheDeviceModelMatchTheCpuDecoder) {
  const std::string dir = fresh_dir("cli_eval_device");
  const std::string src = ANVIL_SOURCE_DIR;
  ASSERT_EQ(
      run_anvil("data tokenize --text " + src + "/README.md --out " + dir + "/readme.tok", true)
          .status,
      0);
  ASSERT_EQ(
      run_anvil("train --config " + src + "/tests/configs/gpt2-tiny.json --set vocab_size=256 " +
                    "-B 2 -T 32 --steps 3 --peak-gflops 1 --data " + dir + "/readme.tok --out " +
                    dir + "/run",
                false)
          .status,
      0);
  std::ofstream(dir + "/task.jsonl")
      << R"({"context": "1 + 1 =", "choices": [" 2", " 3", " 11"], "gold": 0})"
      << "\n";
  const std::string args = "eval --checkpoint " + dir + "/run --data readme=" + dir +
                           "/readme.tok --rows 4 --seq 32 --task " + dir + "/task.jsonl --json";
  const std::string gen = "generate --checkpoint " + dir +
                          "/run --prompt-tokens 70,108,101 --max-new 25 --temperature 0";
  const CliRun cpu = run_anvil(args, false), cpu_gen = run_anvil(gen, false);
  ::setenv("ANVIL_CPU_MODEL", "device", 1);
  const CliRun dev = run_anvil(args, false), dev_gen = run_anvil(gen, false);
  ::unsetenv("ANVIL_CPU_MODEL");
  ASSERT_EQ(cpu.status, 0) << cpu.out;
  ASSERT_EQ(dev.status, 0) << dev.out;
  ASSERT_EQ(cpu_gen.status, 0) << cpu_gen.out;
  ASSERT_EQ(dev_gen.status, 0) << dev_gen.out;
  EXPECT_EQ(dev_gen.out, cpu_gen.out);
  const auto a = nlohmann::json::parse(cpu.out), b = nlohmann::json::parse(dev.out);
  const double want = a["perplexity"][0]["loss"].get<double>();
  EXPECT_NEAR(b["perplexity"][0]["loss"].get<double>(), want, 1e-5 * want);
  EXPECT_EQ(b["tasks"][0]["acc"], a["tasks"][0]["acc"]);
  expect_usage_error("eval --checkpoint " + dir + "/run --data " + dir + "/readme.tok --device tpu",
                     "--device");
  expect_usage_error(gen + " --device tpu", "--device");
  if (!anvil::device::cuda_unavailable_reason().empty()) {
    expect_usage_error(
        "eval --checkpoint " + dir + "/run --data " + dir + "/readme.tok --device cuda",
        "--device");
    expect_usage_error(gen + " --device cuda", "--device");
  }
}
