// The command line's shared conventions, as a user meets them: one dtype
// vocabulary, the same batch flags in train, plan and eval, checkpoints
// named --checkpoint everywhere, defaults in every --help, range errors that
// say what a value must be, nothing on stdout before the inputs are checked,
// the documented exit statuses, and every flag of the recorded command line
// (tests/cli/flags-8acee05.txt) still accepted.
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli/cli_run.hpp"

namespace {

using anvil::test_support::CliRun;
using anvil::test_support::expect_usage_error;
using anvil::test_support::fresh_dir;
using anvil::test_support::run_anvil;

const std::string kSource = ANVIL_SOURCE_DIR;
const std::string kTinyGpt2 = kSource + "/tests/configs/gpt2-tiny.json";

// A 4-step gpt2-tiny run on text into DIR/run.
void train_tiny(const std::string& dir, const std::string& extra = "") {
  const CliRun r =
      run_anvil("train --config " + kTinyGpt2 + " --set vocab_size=256 -B 2 -T 16 --steps 4 " +
                    "--peak-gflops 1 --data " + kSource + "/tests/golden/text.txt --out " + dir +
                    "/run " + extra,
                false);
  ASSERT_EQ(r.status, 0) << r.out;
}

TEST(CliConventions, EveryFlagOfTheRecordedCommandLineIsStillAccepted) {
  std::ifstream in(kSource + "/tests/cli/flags-8acee05.txt");
  std::map<std::string, std::string> help;  // command -> its --help
  int flags = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(": ");
    const std::string cmd = line.substr(0, colon), flag = line.substr(colon + 2);
    if (!help.count(cmd)) help[cmd] = run_anvil(cmd + " --help", false).out;
    const std::regex named("(^|[ ,])" + flag + "([ ,={]|$)", std::regex::multiline);
    EXPECT_TRUE(std::regex_search(help[cmd], named)) << "anvil " << cmd << " lost " << flag;
    ++flags;
  }
  EXPECT_GT(flags, 200);
}

TEST(CliConventions, OneDtypeVocabularyWithTheOldWordsAsAliases) {
  // The canonical words everywhere...
  expect_usage_error("train --config " + kTinyGpt2 + " --dtype fp8", "--dtype/--precision");
  expect_usage_error("train --config " + kTinyGpt2 + " --dtype fp8", "fp32, bf16");
  expect_usage_error("plan --hw h100-sxm --config " + kTinyGpt2 + " --dtype int8", "fp8");
  EXPECT_EQ(run_anvil("plan --hw h100-sxm --config " + kTinyGpt2 + " --dtype fp32", false).status,
            0);
  EXPECT_EQ(run_anvil("plan --hw h100-sxm --config " + kTinyGpt2 + " --dtype f32", false).status,
            0);
  EXPECT_EQ(
      run_anvil("bench gemm --sizes 32 --dtype fp32,bf16 --baselines none --min-time 0.001", false)
          .status,
      0);
  // ...and each command's old words still mean the same.
  EXPECT_EQ(run_anvil("bench gemm --sizes 32 --dtype f32 --baselines none --min-time 0.001", false)
                .status,
            0);
  const std::string dir = fresh_dir("cli_dtype");
  train_tiny(dir, "--precision fp32");
  EXPECT_EQ(
      run_anvil("ckpt export --checkpoint " + dir + "/run --out " + dir + "/a --dtype bf16", true)
          .status,
      0);
  EXPECT_EQ(
      run_anvil("ckpt export --checkpoint " + dir + "/run --out " + dir + "/b --dtype bfloat16",
                true)
          .status,
      0);
  std::ifstream a(dir + "/a/model.safetensors", std::ios::binary),
      b(dir + "/b/model.safetensors", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
            std::string(std::istreambuf_iterator<char>(b), {}));
}

TEST(CliConventions, ATrainCommandLineIsPricedByPlanUnchanged) {
  const std::string train_flags = "--config " + kTinyGpt2 +
                                  " --set vocab_size=256 -B 4 -T 32 --accum 2 --steps 10 --lr 1e-3 "
                                  "--warmup 2 --data some.tok --out runs/x --ckpt-every 5 --zero";
  const CliRun r = run_anvil("plan --hw h100-sxm --json " + train_flags, false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("layout").at("micro_batch").get<int64_t>(), 4) << r.out;
  EXPECT_EQ(j.at("layout").at("seq").get<int64_t>(), 32);
  // batch x accum x dp, the profile's node of 8 devices
  EXPECT_EQ(j.at("layout").at("accumulation").get<int64_t>(), 2);
  EXPECT_EQ(j.at("layout").at("global_batch").get<int64_t>(), 4 * 2 * 8);
  // plan's own words still work; eval takes train's validation flags.
  EXPECT_EQ(
      run_anvil("plan --hw h100-sxm --config " + kTinyGpt2 + " --micro-batch 4", false).status, 0);
  const std::string eval_help = run_anvil("eval --help", false).out;
  for (const char* flag : {"--val-batches", "--val-fraction", "-T,--seq", "--threads"})
    EXPECT_NE(eval_help.find(flag), std::string::npos) << flag;
}

TEST(CliConventions, RangeErrorsSayWhatTheValueMustBe) {
  expect_usage_error("train --config " + kTinyGpt2 + " -B 0", "--batch: must be >= 1, got 0");
  expect_usage_error("train --config " + kTinyGpt2 + " --val-fraction 0.9",
                     "--val-fraction: must be in [0, 0.5], got 0.9");
  expect_usage_error("bench gemm --threads 0", "must be >= 1");
  expect_usage_error("launch --np 0 -- --config x", "must be >= 1");
  // Whole expert-parallel groups at every rank count launch may run.
  expect_usage_error("launch --np 4 --dry-run -- --config x --out /tmp/x --ep 3",
                     "--np 4: expected a multiple of 3");
  expect_usage_error("launch --np 3 --min-ranks 2 --dry-run -- --config x --out /tmp/x --ep 3",
                     "--min-ranks 2: no smaller run fits");
  // A recipe's phases are planned for its rank count: no elastic shrink.
  expect_usage_error("launch --np 2 --min-ranks 1 --dry-run -- --recipe x.json --out /tmp/x",
                     "--min-ranks 1: a --recipe run restarts on its --np 2 ranks only");
  const std::string usage = run_anvil("train --config " + kTinyGpt2 + " -B 0", true).out;
  EXPECT_EQ(usage.find("1797693"), std::string::npos) << usage;
}

TEST(CliConventions, NothingGoesToStdoutBeforeTheInputsAreChecked) {
  const std::string dir = fresh_dir("cli_stdout");
  // generate: the prompt is not echoed before the checkpoint has loaded.
  CliRun r = run_anvil("generate --checkpoint " + dir + "/none --prompt hi", false);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  // --resume latest needs --out: said before the plan is printed.
  r = run_anvil("train --config " + kTinyGpt2 + " --resume latest", false);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  expect_usage_error("train --config " + kTinyGpt2 + " --resume latest",
                     "--resume: 'latest' needs --out");
  // A flag of another optimizer's is refused, not ignored.
  expect_usage_error("train --config " + kTinyGpt2 + " --muon-bf16",
                     "--muon-bf16: needs --optimizer muon, got adamw");
  expect_usage_error("plan --config " + kTinyGpt2 + " --hw mi300x --muon-bf16",
                     "--muon-bf16: needs --optimizer muon, got adamw");
  // A resume that does not continue the checkpoint is refused before anything prints.
  train_tiny(dir);
  r = run_anvil("train --config " + kTinyGpt2 +
                    " --set vocab_size=256 -B 3 -T 16 --steps 8 --out " + dir +
                    "/run --resume latest --peak-gflops 1",
                false);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
}

TEST(CliConventions, CheckpointsAreNamedTheSameWayInEveryCommand) {
  const std::string dir = fresh_dir("cli_checkpoint_names");
  train_tiny(dir);
  const std::string run = dir + "/run";
  EXPECT_EQ(run_anvil("ckpt verify --checkpoint " + run, false).status, 0);
  EXPECT_EQ(run_anvil("ckpt verify " + run, false).status, 0);  // the positional of before
  EXPECT_EQ(run_anvil("ckpt diff --checkpoint " + run + " --against " + run, false).status, 0);
  for (const char* cmd :
       {"ckpt export", "ckpt reshape", "ckpt verify", "ckpt diff", "generate", "eval"})
    EXPECT_NE(run_anvil(std::string(cmd) + " --help", false).out.find("--checkpoint"),
              std::string::npos)
        << cmd;
  // --hf is --format hf; with --format it is a contradiction.
  EXPECT_EQ(
      run_anvil("ckpt export --hf --checkpoint " + run + " --out " + dir + "/hf", true).status, 0);
  expect_usage_error(
      "ckpt export --hf --format original --checkpoint " + run + " --out " + dir + "/o",
      "--format");
}

TEST(CliConventions, DiffTellsMissingOptimizerStateFromDifferentValues) {
  const std::string dir = fresh_dir("cli_diff");
  train_tiny(dir);
  const std::string run = dir + "/run";
  ASSERT_EQ(run_anvil("ckpt export --checkpoint " + run + " --out " + dir + "/hf", true).status, 0);
  ASSERT_EQ(run_anvil("ckpt import --hf " + dir + "/hf --out " + dir + "/back", true).status, 0);
  // The round trip keeps every weight; its optimizer state is gone, which is said, not counted.
  CliRun r = run_anvil("ckpt diff --checkpoint " + run + " --against " + dir + "/back", false);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("identical:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer state only in"), std::string::npos) << r.out;
  // Different weights: exit 1 and a whole sentence naming the largest difference.
  train_tiny(dir + "/other", "--seed 99");
  r = run_anvil("ckpt diff --checkpoint " + run + " --against " + dir + "/other/run", false);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex("the largest difference is [0-9.e+-]+ in \\S+\\n")))
      << r.out;
  // --json lists every differing tensor; the same exit status.
  r = run_anvil("ckpt diff --json --checkpoint " + run + " --against " + dir + "/other/run", false);
  EXPECT_EQ(r.status, 1) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j.at("same").get<bool>());
  EXPECT_EQ(j.at("different").size() + j.at("identical").get<size_t>(),
            j.at("compared").get<size_t>());
  for (const auto& d : j.at("different")) EXPECT_GT(d.at("max_abs").get<double>(), 0) << d;
}

TEST(CliConventions, HelpShowsDefaultsAndEveryComputeCommandTakesThreads) {
  const std::string train = run_anvil("train --help", false).out;
  EXPECT_NE(train.find("-B,--batch INT=4"), std::string::npos) << train;
  EXPECT_NE(train.find("--steps INT=100"), std::string::npos);
  EXPECT_NE(train.find("--lr FLOAT=0.0003"), std::string::npos);
  for (const char* cmd : {"train", "eval", "generate"})
    EXPECT_NE(run_anvil(std::string(cmd) + " --help", false).out.find("--threads"),
              std::string::npos)
        << cmd;
  // The exit statuses are documented once, in the top-level help.
  const std::string top = run_anvil("--help", false).out;
  EXPECT_NE(top.find("2 bad input"), std::string::npos) << top;
}

TEST(CliConventions, ErrorsNameAnvilOnce) {
  for (const std::string& args :
       {std::string("plan --hw h100-sxm"), std::string("launch -- --config x"),
        "train --config " + kTinyGpt2 + " --inject boom@3"}) {
    const CliRun r = run_anvil(args, true);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_EQ(r.out.find("anvil: error: anvil"), std::string::npos) << args << ": " << r.out;
  }
}

TEST(CliConventions, ARunFileRepeatsARun) {
  const std::string dir = fresh_dir("cli_run_file");
  train_tiny(dir, "--json-out " + dir + "/first.json --lr 2e-3 --warmup 1");
  const std::string file = dir + "/run/train.json";
  const auto options = nlohmann::json::parse(std::ifstream(file));
  EXPECT_EQ(options.at("train").at("batch").get<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(options.at("optimizer").at("lr").get<double>(), 2e-3);
  // Repeated into another directory: the same losses, bit for bit.
  const CliRun r = run_anvil(
      "train --train " + file + " --out " + dir + "/again --json-out " + dir + "/again.json",
      false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto a = nlohmann::json::parse(std::ifstream(dir + "/first.json"));
  const auto b = nlohmann::json::parse(std::ifstream(dir + "/again.json"));
  EXPECT_EQ(a.at("losses"), b.at("losses"));
  // A run file with a key no option has is refused, naming it.
  std::ofstream(dir + "/bad.json") << R"({"train": {"batchsize": 4}})";
  expect_usage_error("train --train " + dir + "/bad.json", "train.batchsize");
}

}  // namespace
