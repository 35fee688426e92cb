// anvil: the command line. It parses flags, calls one subsystem and prints
// what it returns; no logic of its own. Input errors print one line and exit
// 2; system failures exit 1.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/process.hpp"
#include "anvil/base/table.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/bench/comm_bench.hpp"
#include "anvil/bench/gemm_bench.hpp"
#include "anvil/bench/hw_report.hpp"
#include "anvil/bench/attention_bench.hpp"
#include "anvil/bench/membw_bench.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/hf.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/base/clock.hpp"
#include "anvil/data/tokens.hpp"
#include "anvil/parallel/data_parallel.hpp"
#include "anvil/eval/generate.hpp"
#include "anvil/eval/evaluate.hpp"
#include "anvil/eval/plot.hpp"
#include "anvil/ft/faults.hpp"
#include "anvil/ft/supervisor.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/model/config.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/train/recipe.hpp"
#include "anvil/train/trainer.hpp"
#include "plan_commands.hpp"

namespace {

using anvil::InputError;

// "4096", "64K", "1M", "2G" (binary multiples) -> bytes or counts.
int64_t parse_size(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &pos);
  } catch (const std::exception&) {
    throw InputError(flag + ": expected a size like 4096, 64K, 1M or 2G, got '" + text + "'");
  }
  const std::string suffix = text.substr(pos);
  int64_t mult = 1;
  if (suffix == "K" || suffix == "k")
    mult = int64_t{1} << 10;
  else if (suffix == "M" || suffix == "m")
    mult = int64_t{1} << 20;
  else if (suffix == "G" || suffix == "g")
    mult = int64_t{1} << 30;
  else if (!suffix.empty()) {
    throw InputError(flag + ": expected a size like 4096, 64K, 1M or 2G, got '" + text + "'");
  }
  if (value < 1) throw InputError(flag + ": expected a positive size, got '" + text + "'");
  return value * mult;
}

std::vector<int64_t> parse_sizes(const std::vector<std::string>& texts, const std::string& flag) {
  std::vector<int64_t> out;
  for (const auto& t : texts) out.push_back(parse_size(t, flag));
  return out;
}

// Where results go: a table (default), --json or --csv on stdout, and
// optionally --out FILE with the JSON, written atomically.
struct OutputFlags {
  bool json = false;
  bool csv = false;
  std::string out;

  void add_to(CLI::App* app) {
    app->add_flag("--json", json, "Print JSON on stdout instead of the table");
    app->add_flag("--csv", csv, "Print CSV on stdout instead of the table");
    app->add_option("--out", out, "Also write the JSON result to this file (atomically)");
  }

  template <typename Result>
  void emit(const Result& r, const std::string& footer) const {
    const auto j = r.to_json();
    if (!out.empty()) anvil::write_file_atomic(out, j.dump(2) + "\n");
    if (json) {
      std::cout << j.dump(2) << "\n";
    } else if (csv) {
      std::cout << r.to_table().to_csv();
    } else {
      std::cout << r.to_table().to_text() << footer;
    }
  }
};

std::string blas_line() {
  const auto& b = anvil::device::blas_info();
  return "BLAS: " + b.corename + " kernels (" + b.reason + ")\n";
}

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

// `anvil bench comm --np N` outside mpirun: run this same command under
// mpirun with N ranks (dropping --np), so a user needs no launcher syntax.
// A collective that timed out on this rank: every rank says what it waited
// for (one write, so ranks' lines do not interleave), gives the others time
// to say it too, then ends the job.
[[noreturn]] void abort_on_timeout(const anvil::comm::CommTimeout& e) {
  const std::string line = std::string("anvil: error: ") + e.what() + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // MPI_Abort does not return
}

[[noreturn]] void relaunch_under_mpirun(int argc, char** argv, int np) {
  std::vector<std::string> args = {"mpirun"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"--oversubscribe", "-np", std::to_string(np), anvil::self_executable()});
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np") {
      ++i;
      continue;
    }
    if (a.rfind("--np=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  ::execvp("mpirun", cargs.data());
  std::cerr << "anvil: error: --np: cannot run mpirun (" << std::strerror(errno)
            << "); install openmpi-bin\n";
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "anvil: a training stack for Mixture-of-Experts language models (after ZAYA1).\n"
      "Microbenchmarks, hardware profiles and a planner; a trainer (dense and ZAYA1,\n"
      "distributed, phased recipes), evaluation, sampling, and Hugging Face interop."};
  app.set_version_flag("--version", std::string("anvil ") + "0.1.0");
  app.require_subcommand(1);

  // anvil hw
  auto* hw = app.add_subcommand("hw", "Describe this machine: CPU, ISA, caches, memory, BLAS, MPI");
  bool hw_json = false;
  std::string hw_profile;
  double hw_min_time = 0.1;
  hw->add_flag("--json", hw_json, "Print JSON instead of the table");
  hw->add_option("--profile", hw_profile,
                 "Measure GEMM and memory bandwidth and write this machine's hardware profile "
                 "(JSON, see docs/hw-profile.md) to this file");
  hw->add_option("--min-time", hw_min_time, "Seconds timed per measurement with --profile")
      ->check(CLI::Range(0.001, 60.0));

  // anvil bench ...
  auto* bench = app.add_subcommand("bench", "Microbenchmarks");
  bench->require_subcommand(1);

  auto* gemm = bench->add_subcommand(
      "gemm", "GEMM throughput by shape, dtype and threads, with baselines from the same run");
  anvil::bench::GemmBenchOptions gopt;
  std::vector<std::string> gsizes;
  std::string internal_spec;
  OutputFlags gout;
  gemm->add_option(
          "--preset", gopt.preset,
          "square: n x n x n for each --sizes; aligned: sizes that are multiples of exactly "
          "1, 8, 16, 64, 128 above each base in --sizes; model: the GEMMs of one layer of "
          "--config; grid: every m, n, k from --sizes (default 64,256,1024,4096) in the "
          "forward, dgrad and wgrad transpositions, up to 35 GFLOP a GEMM (the efficiency "
          "surface anvil plan interpolates)")
      ->check(CLI::IsMember({"square", "aligned", "model", "grid"}))
      ->capture_default_str();
  gemm->add_option(
          "--sizes", gsizes,
          "Dimensions (square; default 128,256,512,1024,2048), base dimensions (aligned; "
          "default 1024) or each dimension's values (grid)")
      ->delimiter(',');
  gemm->add_option("--config", gopt.config_path,
                   "Model config (JSON, configs/) for --preset model");
  gemm->add_option("--set", gopt.overrides,
                   "Override a config key: --set d_model=1024 (repeatable)");
  gemm->add_option("--tokens", gopt.tokens, "Tokens per GEMM for --preset model (batch x sequence)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  gemm->add_option("--tokens-per-expert", gopt.tokens_per_expert,
                   "Tokens per expert GEMM (default: tokens x top_k / experts)")
      ->check(CLI::NonNegativeNumber);
  gemm->add_flag("--backward", gopt.backward, "Also measure each GEMM's dgrad and wgrad");
  gemm->add_option("--dtype", gopt.dtypes, "Input dtypes: f32, bf16 (fp32 accumulation)")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  gemm->add_option("--threads", gopt.threads,
                   "Thread counts to sweep, e.g. 1,2 (default: all cores)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  gemm->add_option(
          "--baselines", gopt.baselines,
          "Baselines measured in the same run: library (raw OpenBLAS, its own CPU "
          "detection), env (raw OpenBLAS, inherited OPENBLAS_CORETYPE), coretype:NAME "
          "(raw OpenBLAS with that core type, e.g. coretype:Prescott), openblas (OpenBLAS "
          "in-process), onednn (oneDNN f32), naive (reference loop, small shapes); or none")
      ->delimiter(',')
      ->capture_default_str();
  gemm->add_option("--min-time", gopt.timing.min_seconds,
                   "Seconds timed per shape (median of the calls is reported)")
      ->check(CLI::Range(0.001, 60.0))
      ->capture_default_str();
  std::string gemm_profile;
  gemm->add_option("--profile", gemm_profile,
                   "Record the measured shapes in this hardware profile (from anvil hw "
                   "--profile); anvil plan prices those GEMMs at the measured rate (grid: "
                   "the surface it interpolates every other shape from)");
  gout.add_to(gemm);
  gemm->add_option("--internal-raw-blas", internal_spec, "(internal: baseline child)")->group("");

  auto* membw = bench->add_subcommand(
      "membw", "Memory bandwidth (STREAM copy/scale/add/triad, read, write) from L1 to DRAM");
  anvil::bench::MembwOptions mopt;
  std::vector<std::string> msizes;
  OutputFlags mout;
  membw->add_option("--kernels", mopt.kernels, "Kernels: copy, scale, add, triad, read, write")
      ->delimiter(',')
      ->check(CLI::IsMember({"copy", "scale", "add", "triad", "read", "write"}))
      ->capture_default_str();
  membw
      ->add_option("--sizes", msizes,
                   "Working-set sizes (all arrays of a kernel), e.g. 32K,1M,1G "
                   "(default 16K to 1G by 4x)")
      ->delimiter(',');
  membw->add_option("--threads", mopt.threads, "Thread counts, e.g. 1,2 (default 1..all cores)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  membw->add_option("--min-time", mopt.min_seconds, "Seconds timed per (kernel, size, threads)")
      ->check(CLI::Range(0.001, 60.0))
      ->capture_default_str();
  mout.add_to(membw);

  auto* attn = bench->add_subcommand(
      "attention",
      "The trainer's causal attention (forward, backward) by sequence length and head size, "
      "against the sgemm peak measured in the same run");
  anvil::bench::AttentionBenchOptions aopt;
  OutputFlags aout;
  attn->add_option("--seqs", aopt.seqs, "Sequence lengths, e.g. 256,2048")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  attn->add_option("--head-dims", aopt.head_dims, "Head sizes, e.g. 64,128")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  attn->add_option("--heads", aopt.heads, "Query heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  attn->add_option("--kv-heads", aopt.kv_heads, "Key/value heads (GQA; default: --heads)")
      ->check(CLI::PositiveNumber);
  attn->add_option("--tokens", aopt.tokens, "Tokens per call (batch = tokens / seq)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  attn->add_option("--threads", aopt.threads, "Threads (default: all cores)")
      ->check(CLI::PositiveNumber);
  attn->add_option("--min-time", aopt.min_seconds, "Seconds timed per case and pass")
      ->check(CLI::Range(0.001, 60.0))
      ->capture_default_str();
  aout.add_to(attn);

  auto* comm_cmd = bench->add_subcommand(
      "comm",
      "Collectives (allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall) by "
      "size and algorithm, against MPI's own; run under mpirun or with --np");
  anvil::bench::CommBenchOptions copt;
  std::string cmin = "8", cmax = "64M", comm_profile;
  int comm_np = 0;
  bool no_check = false;
  OutputFlags cout_flags;
  comm_cmd->add_option("-b,--minbytes", cmin, "Smallest message, e.g. 8, 1K, 1M")
      ->capture_default_str();
  comm_cmd->add_option("-e,--maxbytes", cmax, "Largest message, e.g. 64M, 256M")
      ->capture_default_str();
  comm_cmd->add_option("-f,--stepfactor", copt.factor, "Size multiplier between steps")
      ->check(CLI::Range(1.001, 1024.0))
      ->capture_default_str();
  comm_cmd
      ->add_option("--op", copt.ops,
                   "Ops: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, or all")
      ->delimiter(',')
      ->check(CLI::IsMember(
          {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "all"}))
      ->capture_default_str();
  comm_cmd->add_option("--dtype", copt.dtype, "Element type: f32, bf16, f64, i32, i64")
      ->check(CLI::IsMember({"f32", "bf16", "f64", "i32", "i64"}))
      ->capture_default_str();
  comm_cmd->add_option("--redop", copt.redop, "Reduction: sum, max, min, avg")
      ->check(CLI::IsMember({"sum", "max", "min", "avg"}))
      ->capture_default_str();
  comm_cmd
      ->add_option("--algo", copt.algos,
                   "Algorithms to time next to mpi: ring, rhd, tree, pairwise, shm, hier, auto "
                   "(default: all "
                   "that implement the op)")
      ->delimiter(',')
      ->check(CLI::IsMember({"mpi", "ring", "rhd", "tree", "pairwise", "shm", "hier", "auto"}));
  comm_cmd->add_option("-n,--iters", copt.iters, "Timed iterations per size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  comm_cmd->add_option("-w,--warmup", copt.warmup, "Untimed iterations per size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  comm_cmd
      ->add_option("--passes", copt.passes,
                   "Sweep the sizes this many times (-n and -w each pass) and pool each size's "
                   "samples, so a slow spell of the machine hits every size alike")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::vector<std::string> add_sizes;
  comm_cmd
      ->add_option("--add-sizes", add_sizes,
                   "Sizes to measure besides the -b/-e/-f sweep, e.g. 20M,25M (a profile's "
                   "refined sizes, measured again)")
      ->delimiter(',');
  comm_cmd
      ->add_option("--refine", copt.refine,
                   "Adaptive sweep: where an algorithm's time per byte rises more than this "
                   "ratio between neighbouring sizes (a cache step), also measure the sizes at "
                   "1/3 and 2/3 of the interval (log scale), twice over; 0 = off")
      ->capture_default_str();
  comm_cmd->add_flag("--no-check", no_check, "Skip the exact result check (#wrong shows -)");
  comm_cmd->add_flag("--inplace", copt.in_place, "In-place buffers (as NCCL defines them)");
  comm_cmd->add_option("--root", copt.root, "Root rank for broadcast and reduce")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  comm_cmd
      ->add_option("--timeout", copt.timeout_s,
                   "Seconds before a stuck collective fails, naming the op, step and missing ranks")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  comm_cmd->add_option("--stall-rank", copt.stall_rank,
                       "Testing aid: this rank never joins, so the others show the --timeout "
                       "error (op, step, missing ranks) and the job ends");
  int ranks_per_node = 0;
  comm_cmd
      ->add_option("--ranks-per-node", ranks_per_node,
                   "Simulate nodes of N consecutive ranks for --algo hier (default: real nodes)")
      ->check(CLI::PositiveNumber);
  std::string tuning_out;
  comm_cmd->add_option(
      "--tuning-out", tuning_out,
      "Write the table --algo auto uses (fastest algorithm per op and size; load it "
      "with ANVIL_COMM_TUNING=FILE)");
  comm_cmd
      ->add_option("--np", comm_np, "Launch N ranks with mpirun (when not already under mpirun)")
      ->check(CLI::Range(1, 1024));
  comm_cmd->add_option(
      "--profile", comm_profile,
      "Write the alpha-beta fits into this hardware profile (from anvil hw --profile)");
  cout_flags.add_to(comm_cmd);

  // anvil train
  auto* train =
      app.add_subcommand("train", "Train a decoder from a config on a token file or text");
  anvil::train::TrainOptions topt;
  std::string train_json_out;
  int train_ranks_per_node = 0;
  auto* config_opt =
      train->add_option("--config", topt.config, "Model config JSON (configs/*.json)");
  std::string recipe_path;
  train->add_option("--tensorboard", topt.tensorboard_dir,
                    "Also write the step scalars (loss, lr, grad norm, tokens/s, MFU, "
                    "validation loss, ZAYA1 router load and skip rate) as TensorBoard event "
                    "files in DIR");
  train
      ->add_option("--recipe", recipe_path,
                   "Run a recipe file (docs/recipe.md): phases with token budgets, data "
                   "mixtures, WSD schedules, batch ramp and context extension; needs --out, "
                   "resumes with --resume latest")
      ->excludes(config_opt)
      ->check(CLI::ExistingFile);
  train->add_option("--set", topt.overrides, "Override a config key: --set key=value (repeatable)");
  train->add_option("--data", topt.data,
                    "Token file (anvil data tokenize), a weighted mixture of token files "
                    "(A.tok:0.7,B.tok:0.3), or raw text (byte tokenizer); omitted: random "
                    "tokens, for throughput only");
  train->add_option("--batch,-B", topt.batch, "Sequences per micro-batch")
      ->check(CLI::PositiveNumber);
  train->add_option("--seq,-T", topt.seq, "Tokens per sequence (default: the config's seq_len)")
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--accum", topt.accum,
                   "Micro-batches per optimizer step (gradient accumulation)")
      ->check(CLI::PositiveNumber);
  train->add_option("--steps", topt.steps, "Optimizer steps in the whole run")
      ->check(CLI::PositiveNumber);
  train->add_option("--lr", topt.schedule.lr, "Peak learning rate");
  train->add_option("--schedule", topt.schedule.kind,
                    "Learning-rate schedule: cosine | wsd | constant");
  train->add_option("--warmup", topt.schedule.warmup, "Linear warmup steps")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--min-lr-ratio", topt.schedule.min_lr_ratio, "Final lr as a fraction of --lr");
  train->add_option("--decay-fraction", topt.schedule.decay_fraction,
                    "WSD: the fraction of steps at the end that decays");
  train->add_option("--weight-decay", topt.adamw.weight_decay, "AdamW decoupled weight decay")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--beta1", topt.adamw.beta1, "AdamW beta1")->check(CLI::Range(0.0, 1.0));
  train->add_option("--beta2", topt.adamw.beta2, "AdamW beta2")->check(CLI::Range(0.0, 1.0));
  train->add_option("--clip", topt.clip, "Global gradient-norm clip (0: off)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--seed", topt.seed, "Seed for init and data order");
  train->add_option("--val-fraction", topt.val_fraction, "Tail of the data held out for validation")
      ->check(CLI::Range(0.0, 0.5));
  train->add_option("--val-every", topt.val_every, "Validate every N steps (and at the end)")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--val-batches", topt.val_batches,
                   "Validation sequences (rounded up to a multiple of --batch)")
      ->check(CLI::PositiveNumber);
  train->add_option("--out", topt.out_dir, "Run directory: checkpoints (step-*) and metrics.jsonl");
  train->add_option("--ckpt-every", topt.ckpt_every, "Checkpoint every N steps (and at the end)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--keep", topt.keep, "Checkpoints kept (newest)")->check(CLI::PositiveNumber);
  std::string inject_text;
  train->add_option("--inject", inject_text,
                    "Inject a fault (tests, demos): KIND@STEP[:RANK][=ARG], KIND one of " +
                        anvil::ft::fault_kinds() +
                        "; e.g. kill@30:1, nan@12, slow@5=200 (ms per step), kill-in-save@20=5 "
                        "(ms into the save), corrupt-ckpt@20 (then dies)");
  train->add_option("--heartbeat", topt.heartbeat_dir,
                    "Directory where each rank writes rank-R (step, time, loss) after every step "
                    "(anvil launch watches it)");
  train->add_option("--spike-z", topt.spike_z,
                    "A loss this many standard deviations above the last --spike-window losses "
                    "skips its update (0: off)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--spike-window", topt.spike_window, "Losses the spike check looks back on")
      ->check(CLI::Range(3, 100000));
  train->add_option("--max-spikes", topt.max_spikes,
                    "Spikes in a row that end the run with status 11 (roll back to the last "
                    "checkpoint); a NaN/Inf loss ends it with status 10")
      ->check(CLI::PositiveNumber);
  bool sync_save = false;
  train->add_flag("--sync-save", sync_save,
                  "Write each checkpoint before going on (default: a background thread writes it "
                  "during the next step's forward and backward; that step's update waits for it)");
  auto* resume_opt = train->add_option(
      "--resume", topt.resume,
      "Continue from a checkpoint dir, a run dir, or 'latest' (the newest in --out)");
  train
      ->add_flag("--resume-new-accum", topt.resume_new_accum,
                 "With --resume: allow an --accum other than the checkpoint's (a global-batch "
                 "ramp; weights, optimizer state and step carry over, the data draws follow "
                 "the new accum, so the run leaves the checkpoint's exact trajectory)")
      ->needs(resume_opt);
  train
      ->add_option("--log-every", topt.log_every,
                   "Progress lines every N steps when not on a terminal")
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--peak-gflops", topt.peak_gflops,
                   "GEMM peak for MFU (default: a 2048^3 GEMM in --precision, measured at start)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--optimizer", topt.optimizer,
                    "adamw, or muon: Muon (Newton-Schulz, RMS-matched to AdamW, one --lr) for the "
                    "blocks' weight matrices and AdamW for embeddings, LM head, norms and biases");
  train->add_option("--muon-momentum", topt.muon.momentum, "Muon momentum (Nesterov)")
      ->check(CLI::Range(0.0, 1.0));
  train->add_flag("--muon-bf16", topt.muon.ns_bf16,
                  "Muon: Newton-Schulz GEMMs with bf16 inputs and fp32 accumulation (as the "
                  "reference Muon; ~2x faster here), instead of fp32");
  train->add_option("--balancing", topt.balancing.mode,
                    "ZAYA1 expert-bias balancing after each step: pid (Adam on the biases with the "
                    "load error as gradient), sign (sign updates), none");
  train->add_option("--balance-lr", topt.balancing.lr, "Rate of the expert-bias balancing")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--balance-beta1", topt.balancing.beta1,
                   "pid balancing: Adam beta1 on the load error (its running mean)")
      ->check(CLI::Range(0.0, 0.9999));
  train
      ->add_option("--balance-beta2", topt.balancing.beta2,
                   "pid balancing: Adam beta2 (memory of the squared error that normalises steps; "
                   "a short memory lets the biases keep moving once the early, large errors are "
                   "past)")
      ->check(CLI::Range(0.0, 0.9999));
  train
      ->add_option("--balance-eps", topt.balancing.eps,
                   "pid balancing: Adam epsilon (load errors well below it move the biases in "
                   "proportion to the error, larger ones by about --balance-lr)")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--skip-target", topt.balancing.skip_target,
                   "ZAYA1: target share of tokens routed to the skip class; its bias is then "
                   "balanced like the experts' (default: the skip bias stays at its init, -1)")
      ->check(CLI::Range(0.0, 1.0));
  train
      ->add_option("--aux-loss-coef", topt.balancing.aux_loss_coef,
                   "ZAYA1 router: coefficient of the Switch load-balancing loss (0 = off)")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--z-loss-coef", topt.balancing.z_loss_coef,
                   "ZAYA1 router: coefficient of the router z-loss (0 = off)")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--bucket-mib", topt.bucket_mib,
                   "Data parallel (under mpirun): gradient bucket size in MiB; each bucket's "
                   "all-reduce starts as soon as backward has written it")
      ->check(CLI::PositiveNumber);
  train->add_flag("--zero", topt.zero,
                  "Data parallel: ZeRO-1 - each rank keeps the AdamW state of 1/N of the "
                  "parameters, updates those and all-gathers the weights (Muon matrices: "
                  "each owned whole by one rank)");
  train
      ->add_option("--ep", topt.ep,
                   "Expert parallelism (ZAYA1, under mpirun): groups of N consecutive ranks "
                   "share the experts, E/N each, tokens dispatched by all-to-all")
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--ranks-per-node", train_ranks_per_node,
                   "Data parallel: simulate nodes of N consecutive ranks (the gradient "
                   "all-reduce then crosses them as it would cross hosts); 0: the real nodes")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--precision", topt.precision,
                    "fp32, or bf16: bf16 GEMM inputs with fp32 accumulation, master weights and "
                    "gradients (AVX512_BF16 via oneDNN, else widened to fp32); ZAYA1: its CCA "
                    "projections and experts in bf16, the router and the rest fp32");
  train->add_option("--json-out", train_json_out,
                    "Write a JSON summary (losses, tokens/s, MFU, RSS)");

  // anvil generate
  auto* gen = app.add_subcommand("generate", "Sample text from a checkpoint (KV cache)");
  anvil::eval::GenerateOptions genopt;
  std::vector<int32_t> gen_prompt_tokens;
  gen->add_option("--checkpoint", genopt.checkpoint, "Checkpoint dir or run dir (its newest step)")
      ->required();
  gen->add_option("--prompt", genopt.prompt, "Prompt text (byte tokenizer)");
  gen->add_option("--prompt-tokens", gen_prompt_tokens, "Prompt as token ids")->delimiter(',');
  gen->add_option("--max-new", genopt.max_new, "Tokens to generate")->check(CLI::PositiveNumber);
  gen->add_option("--temperature", genopt.temperature, "Sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--top-k", genopt.top_k, "Sample among the k most likely (0: all)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", genopt.seed, "Sampling seed");

  // anvil size, anvil plan
  anvil::cli::PlanCommands plan_commands;
  plan_commands.add_to(app);

  // anvil ckpt export / import
  auto* ckpt_cmd = app.add_subcommand("ckpt", "Checkpoints");
  ckpt_cmd->require_subcommand(1);
  auto* export_cmd = ckpt_cmd->add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face directory that transformers' "
      "AutoModelForCausalLM.from_pretrained loads (ZAYA1 -> ZayaForCausalLM, GPT-2 shaped -> "
      "GPT2LMHeadModel, Llama shaped -> LlamaForCausalLM; docs/interop.md)");
  anvil::ckpt::ExportOptions xopt;
  bool export_hf = false;
  export_cmd->add_flag("--hf", export_hf,
                       "Hugging Face directory (the default; kept for scripts that name it)");
  export_cmd->add_option("--checkpoint", xopt.checkpoint, "A step-* directory or a run directory")
      ->required();
  export_cmd->add_option("--out", xopt.out_dir, "New directory to write")->required();
  export_cmd
      ->add_option("--format", xopt.format,
                   "hf: transformers' native layout (default); original: ZAYA1's alternating "
                   "layer layout (Zyphra's names, what transformers' converter takes)")
      ->check(CLI::IsMember({"hf", "original"}));
  export_cmd
      ->add_option("--dtype", xopt.dtype,
                   "float32 (default, exact) or bfloat16 (rounded to nearest even)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  export_cmd
      ->add_option("--max-shard-size", xopt.max_shard_bytes,
                   "Largest safetensors file (e.g. 5GB, 500MB); above it the weights are split "
                   "into model-0000k-of-0000n.safetensors with model.safetensors.index.json")
      ->transform(CLI::AsSizeValue(true))
      ->default_str("5GB");
  auto* import_cmd = ckpt_cmd->add_subcommand(
      "import",
      "Turn a transformers checkpoint directory (ZayaForCausalLM, GPT2LMHeadModel, "
      "LlamaForCausalLM) into an anvil run directory: a weights-only checkpoint at step 0 "
      "and model-config.json, for anvil generate and anvil train --config "
      "RUN/model-config.json --resume RUN");
  std::string import_hf_dir, import_out;
  import_cmd
      ->add_option("--hf", import_hf_dir,
                   "Directory with config.json and model.safetensors (or a sharded index)")
      ->required()
      ->check(CLI::ExistingDirectory);
  import_cmd->add_option("--out", import_out, "New (or empty) run directory to write")->required();
  // anvil ckpt verify / reshape
  auto* verify_cmd = ckpt_cmd->add_subcommand(
      "verify",
      "Check a checkpoint (or every checkpoint of a run): each shard against its CRC-32, every "
      "tensor covered once, state.json; exit 0 when all are intact, 2 when one is not");
  std::string verify_path;
  bool verify_json = false;
  verify_cmd->add_option("dir", verify_path, "A step-* directory or a run directory")->required();
  verify_cmd->add_flag("--json", verify_json, "Print JSON instead of the table");
  auto* diff_cmd = ckpt_cmd->add_subcommand(
      "diff",
      "Compare two checkpoints tensor by tensor (weights and optimizer state, any layouts): "
      "exit 0 when every tensor has the same bytes, 1 when one differs");
  std::string diff_a, diff_b;
  diff_cmd->add_option("a", diff_a, "A step-* directory or a run directory")->required();
  diff_cmd->add_option("b", diff_b, "Another")->required();
  auto* reshape_cmd = ckpt_cmd->add_subcommand(
      "reshape",
      "Rewrite a checkpoint as written by N ranks (any layout in; the same tensors out). "
      "anvil train --resume also reshapes on load: any rank count, --zero or not, any --ep");
  std::string reshape_from, reshape_out;
  int reshape_to = 1;
  reshape_cmd->add_option("--checkpoint", reshape_from, "A step-* directory or a run directory")
      ->required();
  reshape_cmd->add_option("--to", reshape_to, "Ranks of the new layout (files rank-00000..N-1)")
      ->required()
      ->check(CLI::PositiveNumber);
  reshape_cmd->add_option("--out", reshape_out, "Run directory to write step-N into")->required();

  // anvil launch
  auto* launch_cmd = app.add_subcommand(
      "launch",
      "Run anvil train under a supervisor that restarts it from the newest intact checkpoint "
      "after a dead rank, a hang, a NaN loss or repeated spikes, with a journal and goodput: "
      "anvil launch --np 2 -- --config C --out RUN ...");
  anvil::ft::LaunchOptions lopt;
  launch_cmd->add_option("--np", lopt.np, "Ranks (mpirun -np; 1: no mpirun)")
      ->check(CLI::PositiveNumber);
  launch_cmd
      ->add_option("--min-np", lopt.min_np,
                   "After a crash restart on --shrink-by fewer ranks, not below this (0: never); "
                   "the global batch is kept (-B scaled)")
      ->check(CLI::NonNegativeNumber);
  launch_cmd->add_option("--shrink-by", lopt.shrink_by, "Ranks a lost node takes with it")
      ->check(CLI::PositiveNumber);
  launch_cmd->add_option("--max-restarts", lopt.max_restarts, "Restart budget")
      ->check(CLI::NonNegativeNumber);
  launch_cmd
      ->add_option("--hang-timeout", lopt.hang_timeout_s,
                   "Seconds without a rank's heartbeat moving before the job counts as hung")
      ->check(CLI::PositiveNumber);
  launch_cmd
      ->add_option("--startup-timeout", lopt.startup_timeout_s,
                   "Seconds to the first heartbeat of an attempt")
      ->check(CLI::PositiveNumber);
  launch_cmd
      ->add_option("--backoff", lopt.backoff_s,
                   "Seconds before the first restart, doubled for each next one (at most 60)")
      ->check(CLI::NonNegativeNumber);
  launch_cmd->add_option("--journal", lopt.journal, "Event journal (JSONL; default RUN/journal.jsonl)");
  launch_cmd->add_option("--inject", lopt.inject,
                         "A fault for the first attempt (anvil train --inject's forms)");
  launch_cmd->add_option("train_args", lopt.train_args, "anvil train's arguments, after --")
      ->required();

  // anvil eval
  auto* eval_cmd = app.add_subcommand(
      "eval",
      "Evaluate a checkpoint (dense or ZAYA1): perplexity per source on the held-out tail of "
      "token files, and multiple-choice tasks from JSONL (acc and acc_norm as lm-eval reports "
      "them; docs/eval.md)");
  anvil::eval::EvalOptions eopt;
  std::vector<std::string> eval_data;
  bool eval_json = false;
  std::string eval_out;
  eval_cmd->add_option("--checkpoint", eopt.checkpoint, "A step-* directory or a run directory")
      ->required();
  eval_cmd->add_option("--data", eval_data,
                       "NAME=FILE.tok (or FILE.tok): perplexity on its held-out tail (repeatable)");
  eval_cmd->add_option("--task", eopt.tasks,
                       "JSONL, one {\"context\", \"choices\", \"gold\"} per line (repeatable)")
      ->check(CLI::ExistingFile);
  eval_cmd->add_option("--rows", eopt.rows, "Perplexity rows per source")
      ->check(CLI::PositiveNumber);
  eval_cmd->add_option("--seq,-T", eopt.seq, "Tokens per perplexity row (default: seq_len)")
      ->check(CLI::NonNegativeNumber);
  eval_cmd->add_option("--val-fraction", eopt.val_fraction,
                       "The held-out tail of each token file (as anvil train's)")
      ->check(CLI::Range(0.0, 0.5));
  eval_cmd->add_option("--limit", eopt.limit, "Questions per task (0: all)")
      ->check(CLI::NonNegativeNumber);
  eval_cmd->add_flag("--json", eval_json, "Print JSON instead of the tables");
  eval_cmd->add_option("--out", eval_out, "Also write the JSON to this file");

  // anvil plot
  auto* plot_cmd = app.add_subcommand(
      "plot",
      "PNG charts (gnuplot) of a run (loss and validation loss by phase, lr, tokens/s and MFU, "
      "ZAYA1 router load and skip rate) or of bench JSON (comm: bus bandwidth by message size "
      "per algorithm; gemm: GFLOP/s by size)");
  std::string plot_run_dir, plot_bench_json, plot_out;
  auto* plot_run_opt = plot_cmd->add_option("--run", plot_run_dir, "A run directory (anvil train --out)");
  plot_cmd->add_option("--bench", plot_bench_json, "anvil bench comm|gemm --json output")
      ->excludes(plot_run_opt)
      ->check(CLI::ExistingFile);
  plot_cmd->add_option("--out", plot_out, "Directory for the PNGs (default: RUN/plots, or next to the JSON)");

  // anvil data tokenize
  auto* data_cmd = app.add_subcommand("data", "Training data");
  data_cmd->require_subcommand(1);
  auto* tokenize = data_cmd->add_subcommand(
      "tokenize", "Text -> token file (with --tokenizer: SentencePiece, else one token per byte)");
  std::vector<std::string> tok_in;
  std::string tok_out, tok_model;
  int tok_threads = 2;
  tokenize->add_option("--text", tok_in, "UTF-8 text file(s), concatenated in order")
      ->required()
      ->check(CLI::ExistingFile);
  tokenize->add_option("--out", tok_out, "Token file to write (format: docs/data.md)")->required();
  tokenize->add_option("--tokenizer", tok_model,
                       "SentencePiece model (anvil data tokenizer train); the token file gets a "
                       "sidecar OUT.json naming it, so runs trained on it decode with it");
  tokenize->add_option("--threads", tok_threads, "Encoding threads")->check(CLI::PositiveNumber);
  bool tok_verify = false;
  tokenize->add_flag("--verify", tok_verify,
                     "Decode the tokens again and compare with the text byte for byte (exit 1 "
                     "and the first differing offset when they differ)");
  auto* tokenizer_cmd = data_cmd->add_subcommand("tokenizer", "SentencePiece tokenizers");
  tokenizer_cmd->require_subcommand(1);
  auto* tok_train = tokenizer_cmd->add_subcommand(
      "train",
      "Train a SentencePiece tokenizer (Debian's libsentencepiece): PREFIX.model and "
      "PREFIX.vocab; newlines are a piece of their own, spaces are kept, unknown characters fall "
      "back to bytes, so text round-trips byte for byte");
  anvil::data::TokenizerTrainOptions ttopt;
  tok_train->add_option("--text", ttopt.texts, "UTF-8 text file(s) to train on")
      ->required()
      ->check(CLI::ExistingFile);
  tok_train->add_option("--out", ttopt.out_prefix, "Output prefix: PREFIX.model, PREFIX.vocab")
      ->required();
  tok_train->add_option("--vocab", ttopt.vocab_size, "Vocabulary size (260..1000000)")
      ->capture_default_str();
  tok_train->add_option("--type", ttopt.type, "bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  tok_train->add_flag("--byte-fallback,!--no-byte-fallback", ttopt.byte_fallback,
                      "Characters outside the vocabulary as <0xNN> byte pieces (default on; "
                      "off: they become <unk> and the round trip is lossy)");
  tok_train->add_option("--special", ttopt.special,
                        "Special tokens, each one id (e.g. --special '<|endoftext|>' '<pad>')");
  tok_train->add_option("--threads", ttopt.threads, "Training threads")
      ->check(CLI::PositiveNumber);
  tok_train->add_option("--max-lines", ttopt.max_lines,
                        "Lines sampled for training (0: all)")
      ->check(CLI::NonNegativeNumber);

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      std::string msg = e.what();
      // CLI11 reports a missing subcommand before an unknown word; name the word.
      const auto rest = app.remaining(true);
      if (std::string(e.get_name()) == "RequiredError" && msg == "A subcommand is required") {
        const std::string where = *bench      ? "anvil bench"
                                  : *data_cmd ? "anvil data"
                                  : *ckpt_cmd ? "anvil ckpt"
                                              : "anvil";
        const std::string expected = *bench      ? "gemm, membw, attention, comm"
                                     : *data_cmd ? "tokenize, tokenizer"
                                     : *ckpt_cmd
                                         ? "export, import, verify, diff, reshape"
                                         : "hw, bench, train, launch, generate, eval, size, plan, ckpt, data, plot";
        msg = rest.empty()
                  ? where + ": expected a command (" + expected + ")"
                  : where + ": unknown command '" + rest.front() + "' (expected " + expected + ")";
      }
      for (char& c : msg) {
        if (c == '\n') c = ' ';
      }
      std::cerr << "anvil: error: " << msg << "\n";
      return 2;
    }

    if (*hw) {
      if (!hw_profile.empty()) {
        anvil::bench::ProfileOptions po;
        po.min_seconds = hw_min_time;
        po.progress = stderr_is_terminal();
        const auto profile = anvil::bench::measure_local_profile(po);
        anvil::plan::save_hw_profile(profile, hw_profile);
        std::cerr << "wrote " << hw_profile << "\n";
      }
      const auto report = anvil::bench::hw_report();
      std::cout << (hw_json ? report.dump(2) + "\n" : anvil::bench::hw_report_text(report));
      return 0;
    }
    if (*gemm) {
      if (!internal_spec.empty()) return anvil::bench::run_raw_blas_child(internal_spec);
      gopt.sizes = parse_sizes(gsizes, "--sizes");
      gopt.progress = stderr_is_terminal();
      // Check the profile before measuring, not after.
      std::optional<anvil::plan::HwProfile> profile;
      if (!gemm_profile.empty()) profile = anvil::plan::load_hw_profile(gemm_profile);
      const auto result = anvil::bench::run_gemm_bench(gopt);
      if (profile) {
        anvil::bench::add_to_profile(result, *profile);
        anvil::plan::save_hw_profile(*profile, gemm_profile);
      }
      gout.emit(result, "\n" + result.summary_text() + blas_line());
      return 0;
    }
    if (*comm_cmd) {
      if (comm_np > 0 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
        relaunch_under_mpirun(argc, argv, comm_np);
      }
      copt.min_bytes = parse_size(cmin, "-b/--minbytes");
      copt.max_bytes = parse_size(cmax, "-e/--maxbytes");
      copt.check = !no_check;
      for (const auto& a : add_sizes) copt.add_sizes.push_back(parse_size(a, "--add-sizes"));
      anvil::comm::MpiRuntime mpi(&argc, &argv);
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      try {
        // Check the profile before minutes of measuring, not after.
        std::optional<anvil::plan::HwProfile> profile;
        if (!comm_profile.empty()) profile = anvil::plan::load_hw_profile(comm_profile);
        anvil::comm::Communicator world(MPI_COMM_WORLD, ranks_per_node);
        const auto result = anvil::bench::run_comm_bench(world, copt);
        if (rank == 0) {
          if (profile) {
            anvil::bench::add_to_profile(result, *profile);
            anvil::plan::save_hw_profile(*profile, comm_profile);
          }
          if (!tuning_out.empty()) anvil::bench::tuning_from(result).save(tuning_out);
          const auto j = result.to_json();
          if (!cout_flags.out.empty()) anvil::write_file_atomic(cout_flags.out, j.dump(2) + "\n");
          std::cout << (cout_flags.json  ? j.dump(2) + "\n"
                        : cout_flags.csv ? result.csv()
                                         : result.text());
        }
      } catch (const anvil::comm::CommTimeout& e) {
        abort_on_timeout(e);
      } catch (const anvil::InputError& e) {
        if (rank == 0) std::cerr << "anvil: error: " << e.what() << "\n";
        return 2;
      }
      return 0;
    }
    if (*train) {
      if (topt.schedule.total <= 1) topt.schedule.total = topt.steps;
      // Under mpirun (or srun with PMIx) every rank is a data-parallel rank.
      const bool under_mpi =
          std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
      std::optional<anvil::comm::MpiRuntime> mpi;
      std::unique_ptr<anvil::parallel::DataParallelGroup> dp;
      int rank = 0;
      if (under_mpi) {
        mpi.emplace(&argc, &argv, /*thread_multiple=*/true);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      }
      anvil::train::TrainResult r;
      try {
        if (under_mpi) {
          dp = std::make_unique<anvil::parallel::DataParallelGroup>(train_ranks_per_node);
          // The cores are shared by the ranks of a machine: each gets its
          // share of compute threads (OMP_NUM_THREADS overrides).
          if (std::getenv("OMP_NUM_THREADS") == nullptr) {
            anvil::set_num_threads(
                std::max(1, anvil::cpu_info().logical_cpus / std::max(1, dp->local_size())));
          }
        }
        topt.async_save = !sync_save;
        if (!inject_text.empty()) topt.inject = anvil::ft::parse_fault(inject_text);
        if (!recipe_path.empty()) {
          const auto recipe = anvil::train::load_recipe(recipe_path, dp ? dp->size() : 1);
          r = anvil::train::run_recipe(recipe, topt, dp.get());
        } else {
          if (topt.config.empty())
            throw anvil::InputError("train: expected --config FILE (or --recipe FILE)");
          r = anvil::train::run_training(topt, dp.get());
        }
      } catch (const anvil::comm::CommTimeout& e) {
        abort_on_timeout(e);
      } catch (const anvil::ft::TrainingFault& e) {
        // Every rank saw the same global loss; a supervisor rolls back.
        if (rank == 0) std::cerr << "\nanvil: error: " << e.what() << "\n";
        return e.exit_code();
      } catch (const anvil::InputError& e) {
        if (!under_mpi) throw;
        if (rank == 0) std::cerr << "anvil: error: " << e.what() << "\n";
        return 2;
      }
      if (!train_json_out.empty() && rank == 0) {
        nlohmann::json j = {{"losses", r.losses},
                            {"step_seconds", r.step_seconds},
                            {"first_step", r.first_step},
                            {"val_loss", r.val_loss},
                            {"tokens_per_second", r.tokens_per_second},
                            {"mfu", r.mfu},
                            {"flops_per_token", r.flops_per_token},
                            {"peak_gflops", r.peak_gflops},
                            {"planned_bytes", r.planned_bytes},
                            {"optimizer_bytes", r.optimizer_bytes},
                            {"parameter_bytes", r.parameter_bytes},
                            {"peak_rss_bytes", r.peak_rss_bytes},
                            {"rank_peak_rss_bytes", r.rank_peak_rss_bytes},
                            {"checkpoint", r.last_checkpoint},
                            {"ranks", r.world},
                            {"comm_seconds", r.comm_seconds},
                            {"comm_exposed_seconds", r.exposed_seconds},
                            {"alltoall_seconds", r.alltoall_seconds}};
        anvil::write_file_atomic(train_json_out, j.dump(2) + "\n");
      }
      return 0;
    }
    if (*gen) {
      genopt.prompt_tokens = gen_prompt_tokens;
      if (genopt.prompt.empty() && genopt.prompt_tokens.empty()) {
        throw InputError("generate: expected --prompt TEXT or --prompt-tokens IDS");
      }
      if (genopt.prompt_tokens.empty()) std::cout << genopt.prompt << std::flush;
      // Text in, text out; token ids in, ids out.
      const bool ids = !genopt.prompt_tokens.empty();
      const auto r = anvil::eval::generate(genopt, [&](int32_t t, const std::string& text) {
        std::cout << (ids ? std::to_string(t) + " " : text) << std::flush;
      });
      std::cout << "\n";
      std::cerr << r.tokens.size() << " tokens at " << static_cast<int>(r.tokens_per_second)
                << " tokens/s" << (r.capped ? " (stopped at the model's context length)" : "")
                << "\n";
      return 0;
    }
    if (plan_commands.run()) return 0;
    if (*export_cmd) {
      const auto r = anvil::ckpt::export_checkpoint(xopt);
      std::cerr << "wrote " << r.out_dir << ": " << r.architecture << ", " << r.tensors
                << " tensors, " << r.parameters << " parameters, " << xopt.dtype << ", "
                << r.files << " safetensors file(s) + config.json\n";
      return 0;
    }
    if (*import_cmd) {
      const auto r = anvil::ckpt::import_hf(import_hf_dir, import_out);
      std::cerr << "wrote " << r.checkpoint_dir << ": " << r.architecture << ", " << r.tensors
                << " tensors, " << r.parameters << " parameters; model config "
                << r.config_path << "\n";
      return 0;
    }
    if (*launch_cmd) {
      if (!lopt.inject.empty()) anvil::ft::parse_fault(lopt.inject);  // checked before starting
      const auto r = anvil::ft::launch(lopt);
      std::fprintf(stderr,
                   "anvil launch: %s after %d attempt(s); wall %.1f s, useful %.1f s, goodput "
                   "%.1f%%; journal %s\n",
                   r.exit_code == 0 ? "finished" : "stopped", r.attempts, r.wall_s, r.useful_s,
                   100 * r.goodput, r.journal.c_str());
      for (const auto& [cause, s] : r.lost_s)
        std::fprintf(stderr, "  lost to %s: %.1f s\n", cause.c_str(), s);
      return r.exit_code;
    }
    if (*verify_cmd) {
      namespace fs = std::filesystem;
      std::vector<std::string> dirs;
      if (fs::exists(fs::path(verify_path) / "state.json") ||
          fs::exists(fs::path(verify_path) / "index.json")) {
        dirs.push_back(verify_path);
      } else {
        anvil::ckpt::resolve_checkpoint(verify_path);  // names the path when it holds none
        dirs = anvil::ckpt::checkpoint_dirs(verify_path);
      }
      anvil::Table t({"checkpoint", "format", "tensors", "shards", "bytes", "status"});
      nlohmann::json j = nlohmann::json::array();
      std::string first_problem;
      for (const auto& d : dirs) {
        const auto r = anvil::ckpt::verify_checkpoint(d);
        t.add_row({d, "v" + std::to_string(r.version), std::to_string(r.tensors),
                   std::to_string(r.shards), anvil::human_bytes(static_cast<double>(r.bytes)),
                   r.problems.empty() ? "intact" : r.problems.front()});
        j.push_back({{"checkpoint", d},
                     {"version", r.version},
                     {"tensors", r.tensors},
                     {"shards", r.shards},
                     {"bytes", r.bytes},
                     {"layout", r.layout},
                     {"problems", r.problems}});
        if (!r.problems.empty() && first_problem.empty())
          first_problem = d + " is damaged: " + r.problems.front();
      }
      std::cout << (verify_json ? j.dump(2) + "\n" : t.to_text());
      if (!first_problem.empty()) throw anvil::InputError(first_problem);
      return 0;
    }
    if (*diff_cmd) {
      const std::string a = anvil::ckpt::resolve_checkpoint(diff_a);
      const std::string b = anvil::ckpt::resolve_checkpoint(diff_b);
      int64_t tensors = 0, differ = 0;
      double worst = 0;
      std::string worst_name;
      for (const char* kind : {"model", "optimizer"}) {
        const auto ta = anvil::ckpt::read_tensors(a, kind), tb = anvil::ckpt::read_tensors(b, kind);
        for (const auto& [name, t] : ta) {
          ++tensors;
          const auto it = tb.find(name);
          if (it == tb.end() || it->second.shape != t.shape) {
            ++differ;
            std::printf("%s: only in %s (or another shape)\n", name.c_str(), a.c_str());
            continue;
          }
          if (std::memcmp(t.data.data(), it->second.data.data(), t.data.size() * sizeof(float)) == 0)
            continue;
          ++differ;
          double d = 0;
          for (size_t i = 0; i < t.data.size(); ++i)
            d = std::max(d, std::abs(static_cast<double>(t.data[i]) - it->second.data[i]));
          if (d >= worst) {
            worst = d;
            worst_name = name;
          }
        }
        for (const auto& [name, t] : tb) {
          if (!ta.count(name)) {
            ++differ;
            std::printf("%s: only in %s\n", name.c_str(), b.c_str());
          }
        }
      }
      if (differ == 0) {
        std::printf("identical: %lld tensors, the same bytes (%s, %s)\n",
                    static_cast<long long>(tensors), a.c_str(), b.c_str());
        return 0;
      }
      std::printf("%lld of %lld tensors differ; largest difference %.3g in %s\n",
                  static_cast<long long>(differ), static_cast<long long>(tensors), worst,
                  worst_name.c_str());
      return 1;
    }
    if (*reshape_cmd) {
      const std::string dir = anvil::ckpt::reshape_checkpoint(reshape_from, reshape_out, reshape_to);
      std::cerr << "wrote " << dir << " as " << reshape_to << " rank file(s)\n";
      return 0;
    }
    if (*tokenize) {
      std::string text;
      for (const auto& f : tok_in) text += anvil::read_file(f);
      if (tok_model.empty()) {
        const auto tokens = anvil::data::encode_bytes(text);
        anvil::data::write_token_file(tok_out, tokens, 256);
        anvil::data::write_token_meta(tok_out, "", tok_in, static_cast<int64_t>(tokens.size()),
                                      static_cast<int64_t>(text.size()));
        std::cerr << "wrote " << tok_out << ": " << tokens.size()
                  << " tokens (bytes, vocabulary 256)\n";
        return 0;
      }
      const anvil::data::Tokenizer tk(tok_model);
      const double t0 = anvil::now_seconds();
      const auto tokens = tk.encode(text, tok_threads);
      const double dt = anvil::now_seconds() - t0;
      if (tok_verify) {
        const std::string back = tk.decode(tokens);
        if (back != text) {
          size_t at = 0;
          while (at < back.size() && at < text.size() && back[at] == text[at]) ++at;
          std::cerr << "anvil: round trip differs at byte " << at << " of " << text.size()
                    << " (decoded " << back.size() << " bytes); nothing written\n";
          return 1;
        }
        std::cerr << "round trip: " << text.size() << " bytes decoded back exactly\n";
      }
      anvil::data::write_token_file(tok_out, tokens, tk.vocab_size());
      anvil::data::write_token_meta(tok_out, tok_model, tok_in, static_cast<int64_t>(tokens.size()),
                                    static_cast<int64_t>(text.size()));
      std::cerr << "wrote " << tok_out << " (+ .json): " << tokens.size() << " tokens, vocabulary "
                << tk.vocab_size() << ", "
                << (tokens.empty() ? 0.0 : static_cast<double>(text.size()) / tokens.size())
                << " bytes per token; encoded " << text.size() / 1e6 << " MB in " << dt
                << " s on " << tok_threads << " thread(s)\n";
      return 0;
    }
    if (*eval_cmd) {
      for (const auto& d : eval_data) {
        const auto eq = d.find('=');
        eopt.data.emplace_back(
            eq == std::string::npos ? std::filesystem::path(d).stem().string() : d.substr(0, eq),
            eq == std::string::npos ? d : d.substr(eq + 1));
      }
      const auto r = anvil::eval::evaluate(eopt);
      const auto j = r.to_json();
      if (!eval_out.empty()) anvil::write_file_atomic(eval_out, j.dump(2) + "\n");
      std::cout << (eval_json ? j.dump(2) + "\n" : r.text());
      return 0;
    }
    if (*plot_cmd) {
      if (plot_run_dir.empty() == plot_bench_json.empty())
        throw InputError("plot: expected --run RUN or --bench FILE.json");
      const auto files =
          plot_run_dir.empty()
              ? anvil::eval::plot_bench(
                    plot_bench_json,
                    plot_out.empty()
                        ? std::filesystem::path(plot_bench_json).parent_path().string() + "/plots"
                        : plot_out)
              : anvil::eval::plot_run(plot_run_dir,
                                      plot_out.empty() ? plot_run_dir + "/plots" : plot_out);
      for (const auto& f : files) std::cout << f << "\n";
      return 0;
    }
    if (*tok_train) {
      const auto r = anvil::data::train_tokenizer(ttopt);
      std::cerr << "wrote " << r.model_path << " and " << r.vocab_path << ": " << ttopt.type
                << ", vocabulary " << r.vocab_size << ", trained on " << r.lines << " lines in "
                << r.seconds << " s\n";
      return 0;
    }
    if (*attn) {
      aopt.progress = stderr_is_terminal();
      const auto result = anvil::bench::run_attention_bench(aopt);
      char peak[160];
      std::snprintf(peak, sizeof peak, "sgemm peak (2048^3 fp32, %d threads, same run): %.1f GFLOP/s\n",
                    result.threads, result.sgemm_peak_gflops);
      aout.emit(result, peak);
      return 0;
    }
    if (*membw) {
      mopt.sizes = parse_sizes(msizes, "--sizes");
      mopt.progress = stderr_is_terminal();
      const auto result = anvil::bench::run_membw_bench(mopt);
      mout.emit(result, "");
      return 0;
    }
  } catch (const anvil::InputError& e) {
    std::cerr << "anvil: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "anvil: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
