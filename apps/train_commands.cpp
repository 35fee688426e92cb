// `anvil train` (a config or a recipe; data parallel under mpirun) and
// `anvil launch` (the same under a restarting supervisor). The train flags
// are the trainer's declared options (train/options.hpp); a run file
// (--train FILE, e.g. a run's own RUN/train.json) sets them first and flags
// given after override it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>

#include "anvil/base/cpu.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/ft/supervisor.hpp"
#include "anvil/parallel/data_parallel.hpp"
#include "anvil/train/recipe.hpp"
#include "anvil/train/trainer.hpp"
#include "cli.hpp"

namespace anvil::cli {
namespace {

// The run file named by `anvil train ... --train FILE`, read before the
// flags are parsed so that the flags override it.
std::string run_file_argument(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "train") != 0) return "";
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--train" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--train=", 0) == 0) return a.substr(8);
  }
  return "";
}

nlohmann::json summary_json(const train::TrainResult& r) {
  std::vector<int64_t> rank_rss;  // gathered as doubles; bytes are whole
  for (const double b : r.rank_peak_rss_bytes) rank_rss.push_back(static_cast<int64_t>(b));
  // A GPU's memory figures; null where the run had none.
  const auto device = [&r](size_t bytes) {
    return r.device_total_bytes > 0 ? nlohmann::json(bytes) : nlohmann::json();
  };
  return {{"losses", r.losses},
          {"step_seconds", r.step_seconds},
          {"part_seconds", r.part_seconds},
          {"first_step", r.first_step},
          {"val_loss", r.val_loss >= 0 ? nlohmann::json(r.val_loss) : nlohmann::json()},  // null: none ran
          {"tokens_per_second", r.tokens_per_second},
          {"mfu", r.mfu},
          {"flops_per_token", r.flops_per_token},
          {"peak_gflops", r.peak_gflops},
          {"peak_source", r.peak_source},
          {"planned_bytes", r.planned_bytes},
          {"optimizer_bytes", r.optimizer_bytes},
          {"optimizer_on_device", r.optimizer_on_device},
          {"parameter_bytes", r.parameter_bytes},
          {"peak_rss_bytes", r.peak_rss_bytes},
          {"rank_peak_rss_bytes", rank_rss},
          {"checkpoint", r.last_checkpoint},
          {"ranks", r.world},
          {"comm_seconds", r.comm_seconds},
          {"comm_exposed_seconds", r.exposed_seconds},
          {"alltoall_seconds", r.alltoall_seconds},
          {"cp", r.cp},
          {"context_seconds", r.context_seconds},
          {"context_halo_seconds", r.context_halo_seconds},
          {"device_used_bytes", device(r.device_used_bytes)},
          {"device_planned_bytes", device(r.device_planned_bytes)},
          {"device_total_bytes", device(r.device_total_bytes)}};
}

class TrainCommands : public CommandFamily {
 public:
  void add_to(CLI::App& app, Context& ctx) override {
    train_ = app.add_subcommand(
        "train",
        "Train a model from a config (or a phased recipe) on a token file, a mixture or text; "
        "data parallel under mpirun -np N");
    run_file_ = run_file_argument(ctx.argc, ctx.argv);
    try {
      if (!run_file_.empty()) options_ = train::load_train_options(run_file_);
    } catch (...) {  // reported by run(), where errors become exit statuses
      run_file_error_ = std::current_exception();
    }
    train_->add_option("--train", run_file_,
                       "Run file (JSON, as a run writes to RUN/train.json): its options first, "
                       "flags given here override them");
    auto* recipe = train_->add_option(
        "--recipe", recipe_,
        "Run a recipe file (docs/recipe.md): phases with token budgets, data mixtures, WSD "
        "schedules, batch ramp and context extension; needs --out, resumes with --resume latest");
    recipe->check(CLI::ExistingFile);
    add_options(train_, options_.model, "model", ctx, "Model");
    add_options(train_, options_.train, "train", ctx, "Data and loop");
    add_options(train_, options_.optimizer, "optimizer", ctx, "Optimizer");
    add_options(train_, options_.balancing, "balancing", ctx, "ZAYA1 routing");
    add_options(train_, options_.parallel, "parallel", ctx, "Parallelism (under mpirun)");
    add_options(train_, options_.checkpoint, "checkpoint", ctx, "Checkpoints");
    add_options(train_, options_.metrics, "metrics", ctx, "Metrics");
    add_options(train_, options_.guard, "guard", ctx, "Fault checks");
    add_options(train_, options_.faults, "faults", ctx, "Fault checks");
    add_launch(app);
  }

  std::optional<int> run(Context& ctx) override {
    if (*launch_) return launch();
    if (!*train_) return std::nullopt;
    if (run_file_error_) std::rethrow_exception(run_file_error_);
    // Checked before MPI starts or anything is printed or written.
    if (recipe_.empty()) {
      options_.finish();
      if (options_.model.config.empty())
        throw InputError("model.config: expected a model config file (or --recipe FILE)");
    } else if (!options_.model.config.empty()) {
      throw InputError("--recipe: a recipe names its model config; drop model.config");
    } else {
      refuse_flags_the_recipe_sets();
    }
    std::optional<comm::MpiRuntime> mpi;
    std::unique_ptr<parallel::DataParallelGroup> dp;
    if (under_mpirun()) {
      mpi.emplace(&ctx.argc, &ctx.argv, /*thread_multiple=*/true);
      MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
    }
    try {
      if (mpi) dp = std::make_unique<parallel::DataParallelGroup>(options_.parallel.ranks_per_node);
      set_threads(dp.get());
      const train::TrainResult r =
          recipe_.empty() ? train::run_training(options_, dp.get())
                          : train::run_recipe(train::load_recipe(recipe_, dp ? dp->size() : 1),
                                              options_, dp.get());
      if (!options_.metrics.json_out.empty() && ctx.rank == 0)
        write_file_atomic(options_.metrics.json_out, summary_json(r).dump(2) + "\n");
      if (r.stop_signal != 0) return 128 + r.stop_signal;  // stopped early; resumable
    } catch (const comm::CommTimeout& e) {
      abort_on_timeout(e);
    } catch (const InputError&) {  // reported by rank 0 (cli.hpp), while MPI is up
      if (mpi) ctx.every_rank_failed = every_rank_fails();
      throw;
    } catch (const ft::TrainingFault&) {
      if (mpi) ctx.every_rank_failed = every_rank_fails();
      throw;
    }
    return 0;
  }

 private:
  // The cores are shared by the ranks of a machine: each gets its share of
  // compute threads unless train.threads or OMP_NUM_THREADS says otherwise.
  void set_threads(parallel::DataParallelGroup* dp) const {
    if (options_.train.threads > 0) {
      set_num_threads(options_.train.threads);
    } else if (dp && std::getenv("OMP_NUM_THREADS") == nullptr) {
      set_num_threads(std::max(1, cpu_info().logical_cpus / std::max(1, dp->local_size())));
    }
  }

  void add_launch(CLI::App& app) {
    launch_ = app.add_subcommand(
        "launch",
        "Run anvil train under a supervisor that restarts it from the newest intact checkpoint "
        "after a dead rank, a hang, a NaN loss or repeated spikes, with a journal and goodput: "
        "anvil launch --np 2 -- --config C --out RUN ...");
    ft::LaunchOptions& l = launch_options_;
    launch_->add_option("--np", l.np,
                        "Ranks (mpirun -np; 1 on this machine: no mpirun); default: the hosts' "
                        "slots, or 1")
        ->check(at_least(1));
    launch_->add_option("--hosts", hosts_text_,
                        "Hosts and ranks on each, mpirun's --host form: h1:2,h2:2 (ranks fill "
                        "them in order); default: --hostfile, else Slurm's allocation "
                        "(SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE or SLURM_NTASKS) when "
                        "there is one, else this machine");
    launch_->add_option("--hostfile", hostfile_,
                        "Open MPI hostfile: a host per line, NAME [slots=N] or NAME:N, # comments")
        ->check(CLI::ExistingFile);
    launch_
        ->add_option("--min-ranks,--min-np", l.min_ranks,
                     "Elastic restart, not below this many ranks (0: the same layout every "
                     "time). Across hosts: hosts that do not answer after a fault are left out, "
                     "a lost host answering again is taken back at the next checkpoint, one "
                     "lost twice stays out. On one machine: a crash takes --shrink-by ranks. "
                     "The global batch is kept: each rank keeps -B and --accum takes up the lost ranks' rows")
        ->check(at_least(0))
        ->capture_default_str();
    launch_->add_option("--shrink-by", l.shrink_by,
                        "On one machine (no hosts): ranks a crash takes away")
        ->check(at_least(1))
        ->capture_default_str();
    launch_
        ->add_option("--probe-port", l.probe_port,
                     "A host answers when a TCP connection to this port connects or is refused "
                     "(22: ssh); a timeout or an unreachable network: it does not")
        ->check(CLI::Range(1, 65535))
        ->capture_default_str();
    launch_->add_option("--probe-timeout", l.probe_timeout_s, "Seconds a host has to answer")
        ->check(at_least(0.001))
        ->capture_default_str();
    launch_
        ->add_option("--probe-every", l.probe_every_s,
                     "Seconds between probes of the hosts an elastic restart left out")
        ->check(at_least(0.001))
        ->capture_default_str();
    launch_->add_option("--mpirun-args", mpirun_args_,
                        "More mpirun arguments, one string split at spaces (write it "
                        "--mpirun-args='--mca plm_rsh_agent ssh')");
    launch_->add_flag("--dry-run", l.dry_run,
                      "Print the first attempt's command line (the mpirun line) and stop");
    launch_->add_option("--max-restarts", l.max_restarts, "Restart budget")
        ->check(at_least(0))
        ->capture_default_str();
    launch_
        ->add_option("--hang-timeout", l.hang_timeout_s,
                     "Seconds without a rank's heartbeat moving before the job counts as hung")
        ->check(at_least(0.001))
        ->capture_default_str();
    launch_
        ->add_option("--startup-timeout", l.startup_timeout_s,
                     "Seconds to the first heartbeat of an attempt")
        ->check(at_least(0.001))
        ->capture_default_str();
    launch_
        ->add_option("--stop-grace", l.stop_grace_s,
                     "Seconds an interrupted launch (SIGINT/SIGTERM) gives the job to finish its "
                     "step and write its checkpoint before SIGKILL (a second interrupt: at once)")
        ->check(at_least(0))
        ->capture_default_str();
    launch_
        ->add_option("--backoff", l.backoff_s,
                     "Seconds before the first restart, doubled for each next one (at most 60)")
        ->check(at_least(0))
        ->capture_default_str();
    launch_->add_option("--journal", l.journal, "Event journal (JSONL; default RUN/journal.jsonl)");
    launch_->add_option("--inject", l.inject,
                        "A fault for the first attempt (anvil train --inject's forms)");
    launch_->add_option("train_args", l.train_args, "anvil train's arguments, after --")
        ->required();
  }

  int launch() {
    ft::LaunchOptions& l = launch_options_;
    if (!hosts_text_.empty() && !hostfile_.empty())
      throw InputError("--hosts and --hostfile: expected one of them");
    if (!hosts_text_.empty()) l.hosts = ft::parse_hosts(hosts_text_, "--hosts");
    if (!hostfile_.empty()) l.hosts = ft::read_hostfile(hostfile_);
    if (l.hosts.empty() && l.np == 0) {
      l.hosts = ft::slurm_hosts([](const char* name) {
        const char* v = std::getenv(name);
        return std::string(v ? v : "");
      });
      if (!l.hosts.empty())
        std::fprintf(stderr, "anvil launch: Slurm allocation: %s\n", ft::host_list(l.hosts).c_str());
    }
    std::istringstream words(mpirun_args_);
    for (std::string w; words >> w;) l.mpirun_args.push_back(w);
    if (!l.inject.empty()) ft::parse_fault(l.inject, "--inject");  // checked before starting
    const auto r = ft::launch(l);
    if (l.dry_run) {
      std::printf("%s\n", r.command.c_str());
      return 0;
    }
    if (r.exit_code == 2 && r.journal.empty()) return 2;  // the child named what it refused
    std::fprintf(stderr,
                 "anvil launch: %s after %d attempt(s); wall %.1f s, useful %.1f s, goodput "
                 "%.1f%%; journal %s\n",
                 r.exit_code == 0 ? "finished" : "stopped", r.attempts, r.wall_s, r.useful_s,
                 100 * r.goodput, r.journal.c_str());
    for (const auto& [cause, s] : r.lost_s)
      std::fprintf(stderr, "  lost to %s: %.1f s\n", cause.c_str(), s);
    return r.exit_code;
  }

  CLI::App* train_ = nullptr;
  CLI::App* launch_ = nullptr;
  train::TrainOptions options_;
  // A recipe sets these per phase; the same flag beside it would be ignored.
  void refuse_flags_the_recipe_sets() {
    static const std::vector<std::string> keys = {"model.set",
                                                  "train.data",
                                                  "train.batch",
                                                  "train.seq",
                                                  "train.accum",
                                                  "train.steps",
                                                  "train.seed",
                                                  "train.val_every",
                                                  "parallel.cp",
                                                  "optimizer.name",
                                                  "optimizer.lr",
                                                  "optimizer.schedule",
                                                  "optimizer.warmup",
                                                  "optimizer.min_lr_ratio",
                                                  "optimizer.decay_fraction",
                                                  "optimizer.schedule_total",
                                                  "checkpoint.every"};
    options_.walk([&](const OptionInfo& info, auto&, const auto&) {
      if (std::find(keys.begin(), keys.end(), info.key()) == keys.end()) return;
      const CLI::Option* o = train_->get_option_no_throw(info.long_flag());
      if (o != nullptr && o->count() > 0)
        throw InputError("--recipe: the recipe sets " + info.long_flag() +
                         " for each phase; drop " + info.long_flag());
    });
  }

  std::string run_file_, recipe_;
  std::exception_ptr run_file_error_;
  ft::LaunchOptions launch_options_;
  std::string hosts_text_, hostfile_, mpirun_args_;
};

}  // namespace

std::unique_ptr<CommandFamily> make_train_commands() {
  return std::make_unique<TrainCommands>();
}

}  // namespace anvil::cli
