#include "anvil/ft/supervisor.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/process.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ft/faults.hpp"

namespace anvil::ft {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::atomic<bool> g_interrupted{false};
void on_signal(int) {
  g_interrupted.store(true);
}

// The value after `flag` (or after "flag=") in args; "" when absent.
std::string arg_value(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
  }
  return "";
}

// The train arguments' --cp (1 when absent; a bad value is the trainer's
// to report).
int context_parallel(const std::vector<std::string>& args) {
  const std::string v = arg_value(args, "--cp");
  char* end = nullptr;
  const long cp = v.empty() ? 1 : std::strtol(v.c_str(), &end, 10);
  return cp >= 1 && (v.empty() || *end == '\0') ? static_cast<int>(cp) : 1;
}

// args with the value of `flag` (or `alias`) replaced; appended when absent.
std::vector<std::string> with_value(std::vector<std::string> args, const std::string& flag,
                                    const std::string& alias, const std::string& value) {
  for (size_t i = 0; i < args.size(); ++i) {
    if ((args[i] == flag || args[i] == alias) && i + 1 < args.size()) {
      args[i + 1] = value;
      return args;
    }
  }
  args.push_back(flag);
  args.push_back(value);
  return args;
}

struct Heartbeat {
  int64_t step = -1;
  double seen = 0;  // our clock when this step was first seen
};

// Reads <dir>/rank-R ("STEP TIME LOSS"); step -1 when absent.
int64_t read_step(const fs::path& file) {
  std::ifstream f(file);
  long long step = -1;
  if (f >> step) return step;
  return -1;
}

pid_t spawn(const std::vector<std::string>& argv) {
  const pid_t pid = ::fork();
  if (pid < 0) throw SystemError(std::string("anvil launch: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own process group: the supervisor stops mpirun and every rank at once
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    std::fprintf(stderr, "anvil launch: cannot run %s: %s\n", a[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

// SIGTERM to the job's group, SIGKILL after `grace` seconds; reaps it.
int stop_job(pid_t pid, double grace) {
  ::kill(-pid, SIGTERM);
  const double t0 = now_seconds();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (now_seconds() - t0 > grace) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);  // stragglers of the group
  return status;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// Sum of the per-step seconds in metrics.jsonl: the steps of the final
// trajectory (a resume drops the lines past its step).
double useful_seconds(const fs::path& metrics) {
  std::ifstream f(metrics);
  double total = 0;
  for (std::string line; std::getline(f, line);) {
    try {
      total += json::parse(line).value("seconds", 0.0);
    } catch (const json::exception&) {
    }
  }
  return total;
}

// How one attempt ended, as the supervisor saw it.
struct AttemptEnd {
  std::string cause;  // "" (finished), nan, spikes, input, crash, interrupted, hang
  int status = 0;
  double detected = 0, last_progress = 0;
  int64_t last_step = -1;
};

// The restart loop of `launch`: one attempt after another, each watched
// through the ranks' heartbeats, with the journal and the time lost per cause.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, std::string out)
      : o_(o),
        out_(std::move(out)),
        heartbeat_dir_(fs::path(out_) / "heartbeat"),
        np_(o.np),
        cp_(context_parallel(o.train_args)),
        args_(o.train_args) {
    r_.journal = o.journal.empty() ? (fs::path(out_) / "journal.jsonl").string() : o.journal;
    journal_.open(r_.journal, std::ios::app);
    if (!journal_) throw SystemError(r_.journal + ": cannot open for appending");
    const std::string batch_text =
        arg_value(args_, "-B").empty() ? arg_value(args_, "--batch") : arg_value(args_, "-B");
    // Rows per step over the data-parallel replicas (np / cp of them).
    rows_ = (batch_text.empty() ? 4 : std::stoll(batch_text)) * (o.np / cp_);
  }

  LaunchResult run() {
    log({{"event", "launch"}, {"np", np_}, {"train", join(args_)}, {"journal", r_.journal}});
    for (int attempt = 1;; ++attempt) {
      r_.attempts = attempt;
      const AttemptEnd end = run_attempt(attempt);
      if (end.cause.empty()) {
        log({{"event", "finished"}, {"attempt", attempt}, {"step", end.last_step}});
        break;
      }
      if (!recover(attempt, end)) break;
    }
    r_.wall_s = now_seconds() - t_start_;
    r_.useful_s = useful_seconds(fs::path(out_) / "metrics.jsonl");
    r_.goodput = r_.wall_s > 0 ? r_.useful_s / r_.wall_s : 0;
    json lost = r_.lost_s;
    log({{"event", "done"},
         {"exit", r_.exit_code},
         {"attempts", r_.attempts},
         {"wall_s", r_.wall_s},
         {"useful_s", r_.useful_s},
         {"goodput", r_.goodput},
         {"lost_s", lost}});
    return r_;
  }

 private:
  void log(json e) {
    e["t"] = std::round((now_seconds() - t_start_) * 1000) / 1000;
    journal_ << e.dump() << "\n";
    journal_.flush();
    if (!o_.quiet) std::fprintf(stderr, "anvil launch: %s\n", e.dump().c_str());
  }

  std::vector<std::string> command(int attempt, bool resume) const {
    std::vector<std::string> cmd;
    if (np_ > 1) {
      cmd = {"mpirun"};
      if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
      cmd.insert(cmd.end(), {"--oversubscribe", "-np", std::to_string(np_)});
    }
    cmd.push_back(self_executable());
    cmd.push_back("train");
    cmd.insert(cmd.end(), args_.begin(), args_.end());
    cmd.insert(cmd.end(), {"--heartbeat", heartbeat_dir_.string()});
    if (resume) cmd.insert(cmd.end(), {"--resume", "latest"});
    if (attempt == 1 && !o_.inject.empty()) cmd.insert(cmd.end(), {"--inject", o_.inject});
    return cmd;
  }

  AttemptEnd run_attempt(int attempt) {
    fs::remove_all(heartbeat_dir_);
    fs::create_directories(heartbeat_dir_);
    const bool has_checkpoint = !ckpt::checkpoint_dirs(out_).empty();
    log({{"event", "start"}, {"attempt", attempt}, {"np", np_}, {"resume", has_checkpoint}});
    const double t_attempt = now_seconds();
    const pid_t pid = spawn(command(attempt, has_checkpoint));
    return watch(pid, attempt, t_attempt);
  }

  // Polls the job and the heartbeats until it ends, hangs or is interrupted.
  AttemptEnd watch(pid_t pid, int attempt, double t_attempt) {
    std::vector<Heartbeat> beats(static_cast<size_t>(np_));
    first_step_seen_ = false;
    recomputing_ = pending_restart_from_ >= 0 && failed_at_step_ > 0;
    resumed_step_ = -1;
    AttemptEnd end;
    end.last_progress = now_seconds();
    for (;;) {
      const pid_t done = ::waitpid(pid, &end.status, WNOHANG);
      const double now = now_seconds();
      for (int k = 0; k < np_; ++k) {
        const int64_t s = read_step(heartbeat_dir_ / ("rank-" + std::to_string(k)));
        auto& b = beats[static_cast<size_t>(k)];
        if (s != b.step) {
          b.step = s;
          b.seen = now;
          end.last_progress = now;
        }
      }
      progress(beats, attempt, now, end);
      if (done == pid) {
        end.detected = now;
        end.cause = cause_of(end.status);
        return end;
      }
      if (g_interrupted.load()) {
        stop_job(pid, 10);
        end.cause = "interrupted";
        end.detected = now;
        return end;
      }
      // A hang: some rank's heartbeat has not moved for the timeout (or no
      // heartbeat at all since the start).
      for (const auto& b : beats) {
        if (b.step < 0 ? now - t_attempt > o_.startup_timeout_s
                       : now - b.seen > o_.hang_timeout_s) {
          end.detected = now;
          end.status = stop_job(pid, 5);
          end.cause = "hang";
          return end;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // The journal's recovery events as the heartbeats move.
  void progress(const std::vector<Heartbeat>& beats, int attempt, double now, AttemptEnd& end) {
    const auto by_step = [](const Heartbeat& a, const Heartbeat& b) { return a.step < b.step; };
    const int64_t min_step = std::min_element(beats.begin(), beats.end(), by_step)->step;
    const int64_t max_step = std::max_element(beats.begin(), beats.end(), by_step)->step;
    if (resumed_step_ < 0) resumed_step_ = read_step(heartbeat_dir_ / "start-0");
    end.last_step = std::max(end.last_step, max_step);
    if (recomputing_ && first_step_seen_ && min_step >= failed_at_step_) {
      // The steps the fault threw away, done again.
      recomputing_ = false;
      r_.lost_s[pending_cause_recompute_] += now - first_step_at_;
      log({{"event", "caught-up"},
           {"attempt", attempt},
           {"step", min_step},
           {"recompute_s", now - first_step_at_}});
    }
    if (first_step_seen_ || resumed_step_ < 0 || max_step <= resumed_step_) return;
    first_step_seen_ = true;
    first_step_at_ = now;
    if (pending_restart_from_ < 0) return;
    // Restart time: from detecting the fault to the first new step.
    log({{"event", "recovered"},
         {"attempt", attempt},
         {"cause", pending_cause_},
         {"restart_s", now - pending_restart_from_},
         {"resumed_step", resumed_step_},
         {"recomputed_steps", std::max<int64_t>(0, failed_at_step_ - resumed_step_)}});
    r_.lost_s[pending_cause_] += now - pending_restart_from_;
    pending_cause_recompute_ = pending_cause_;
    pending_restart_from_ = -1;
  }

  static std::string cause_of(int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitNonFinite) return "nan";
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitSpikes) return "spikes";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) return "input";
    return "crash";
  }

  // Journals the fault and prepares the next attempt; false: stop here.
  bool recover(int attempt, const AttemptEnd& end) {
    // Detection: from the last heartbeat progress to noticing the fault.
    const double detect_s = end.detected - end.last_progress;
    log({{"event", "fault"},
         {"attempt", attempt},
         {"cause", end.cause},
         {"last_step", end.last_step},
         {"detect_s", detect_s},
         {"status", WIFEXITED(end.status) ? WEXITSTATUS(end.status) : -WTERMSIG(end.status)}});
    if (end.cause == "input" || end.cause == "interrupted") {
      r_.exit_code = end.cause == "input" ? 2 : 130;
      return false;
    }
    if (attempt > o_.max_restarts) {
      log({{"event", "gave-up"}, {"restarts", attempt - 1}});
      r_.exit_code = 1;
      return false;
    }
    r_.lost_s[end.cause] += 0;                        // (restart and recompute counted at recovery)
    pending_restart_from_ = end.detected - detect_s;  // the fault's time, as near as we know
    pending_cause_ = end.cause;
    failed_at_step_ = end.last_step;
    // A smaller grid keeps the context-parallel groups whole: np - shrink_by
    // must be a multiple of cp, and the rows must split over its replicas.
    const int smaller = np_ - o_.shrink_by;
    if (end.cause == "crash" && o_.min_np > 0 && smaller >= o_.min_np && smaller % cp_ == 0 &&
        rows_ % (smaller / cp_) == 0) {
      np_ = smaller;
      const int64_t batch = rows_ / (np_ / cp_);
      args_ = with_value(args_, "-B", "--batch", std::to_string(batch));
      log({{"event", "shrink"}, {"np", np_}, {"cp", cp_}, {"batch", batch}});
    }
    const double backoff = std::min(60.0, o_.backoff_s * std::pow(2.0, attempt - 1));
    log({{"event", "backoff"}, {"seconds", backoff}});
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    return true;
  }

  const LaunchOptions& o_;
  std::string out_;
  fs::path heartbeat_dir_;
  int np_;
  int cp_;  // context-parallel ranks per group (the train arguments' --cp)
  std::vector<std::string> args_;
  int64_t rows_ = 0;
  LaunchResult r_;
  std::ofstream journal_;
  double t_start_ = now_seconds();
  double pending_restart_from_ = -1;  // detection time of the fault being recovered
  std::string pending_cause_, pending_cause_recompute_;
  int64_t failed_at_step_ = 0;
  bool first_step_seen_ = false, recomputing_ = false;
  double first_step_at_ = 0;
  int64_t resumed_step_ = -1;
};

}  // namespace

LaunchResult launch(const LaunchOptions& o) {
  const std::string out = arg_value(o.train_args, "--out");
  if (out.empty())
    throw InputError("launch: the train arguments need --out RUN (checkpoints to restart from)");
  if (o.np < 1) throw InputError("--np: expected >= 1");
  if (o.min_np > o.np) throw InputError("--min-np: expected <= --np " + std::to_string(o.np));
  if (const int cp = context_parallel(o.train_args); o.np % cp != 0)
    throw InputError("--np " + std::to_string(o.np) + ": expected a multiple of the train " +
                     "arguments' --cp " + std::to_string(cp) + " (whole context-parallel groups)");
  for (const char* flag : {"--resume", "--heartbeat", "--inject"}) {
    if (!arg_value(o.train_args, flag).empty())
      throw InputError(std::string("launch: ") + flag +
                       " among the train arguments; the supervisor sets it");
  }
  fs::create_directories(out);
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);
  g_interrupted.store(false);
  const LaunchResult r = Supervisor(o, out).run();
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  return r;
}

}  // namespace anvil::ft
