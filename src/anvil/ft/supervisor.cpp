#include "anvil/ft/supervisor.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
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

}  // namespace

LaunchResult launch(const LaunchOptions& o) {
  const std::string out = arg_value(o.train_args, "--out");
  if (out.empty())
    throw InputError("anvil launch: the train arguments need --out RUN (checkpoints to restart from)");
  if (o.np < 1) throw InputError("--np: expected >= 1");
  if (o.min_np > o.np) throw InputError("--min-np: expected <= --np " + std::to_string(o.np));
  for (const char* flag : {"--resume", "--heartbeat", "--inject"}) {
    if (!arg_value(o.train_args, flag).empty())
      throw InputError(std::string("anvil launch: ") + flag +
                       " among the train arguments; the supervisor sets it");
  }
  fs::create_directories(out);
  const fs::path heartbeat_dir = fs::path(out) / "heartbeat";
  LaunchResult r;
  r.journal = o.journal.empty() ? (fs::path(out) / "journal.jsonl").string() : o.journal;
  std::ofstream journal(r.journal, std::ios::app);
  if (!journal) throw SystemError(r.journal + ": cannot open for appending");
  const double t_start = now_seconds();
  auto log = [&](json e) {
    e["t"] = std::round((now_seconds() - t_start) * 1000) / 1000;
    journal << e.dump() << "\n";
    journal.flush();
    if (!o.quiet) std::fprintf(stderr, "anvil launch: %s\n", e.dump().c_str());
  };
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);
  g_interrupted.store(false);

  int np = o.np;
  std::vector<std::string> args = o.train_args;
  const std::string batch_text = arg_value(args, "-B").empty() ? arg_value(args, "--batch")
                                                                : arg_value(args, "-B");
  const int64_t rows = (batch_text.empty() ? 4 : std::stoll(batch_text)) * o.np;  // per step
  double pending_restart_from = -1;  // detection time of the fault being recovered
  std::string pending_cause, pending_cause_recompute;
  int64_t failed_at_step = 0;
  log({{"event", "launch"}, {"np", np}, {"train", join(args)}, {"journal", r.journal}});
  for (int attempt = 1;; ++attempt) {
    r.attempts = attempt;
    fs::remove_all(heartbeat_dir);
    fs::create_directories(heartbeat_dir);
    std::vector<std::string> cmd;
    if (np > 1) {
      cmd = {"mpirun"};
      if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
      cmd.insert(cmd.end(), {"--oversubscribe", "-np", std::to_string(np)});
    }
    cmd.push_back(self_executable());
    cmd.push_back("train");
    cmd.insert(cmd.end(), args.begin(), args.end());
    cmd.insert(cmd.end(), {"--heartbeat", heartbeat_dir.string()});
    const bool has_checkpoint = !ckpt::checkpoint_dirs(out).empty();
    if (has_checkpoint) cmd.insert(cmd.end(), {"--resume", "latest"});
    if (attempt == 1 && !o.inject.empty()) cmd.insert(cmd.end(), {"--inject", o.inject});
    log({{"event", "start"}, {"attempt", attempt}, {"np", np}, {"resume", has_checkpoint}});
    const double t_attempt = now_seconds();
    const pid_t pid = spawn(cmd);

    std::vector<Heartbeat> beats(static_cast<size_t>(np));
    bool first_step_seen = false;
    double first_step_at = 0;
    bool recomputing = pending_restart_from >= 0 && failed_at_step > 0;
    int64_t resumed_step = -1, last_step = -1;
    int status = 0;
    std::string cause;
    double detected = 0, last_progress = now_seconds();
    for (;;) {
      const pid_t done = ::waitpid(pid, &status, WNOHANG);
      const double now = now_seconds();
      for (int k = 0; k < np; ++k) {
        const int64_t s = read_step(heartbeat_dir / ("rank-" + std::to_string(k)));
        auto& b = beats[static_cast<size_t>(k)];
        if (s != b.step) {
          b.step = s;
          b.seen = now;
          last_progress = now;
        }
      }
      const int64_t min_step =
          std::min_element(beats.begin(), beats.end(), [](auto& a, auto& b) {
            return a.step < b.step;
          })->step;
      const int64_t max_step =
          std::max_element(beats.begin(), beats.end(), [](auto& a, auto& b) {
            return a.step < b.step;
          })->step;
      if (resumed_step < 0) resumed_step = read_step(heartbeat_dir / "start-0");
      last_step = std::max(last_step, max_step);
      if (recomputing && first_step_seen && min_step >= failed_at_step) {
        // The steps the fault threw away, done again.
        recomputing = false;
        r.lost_s[pending_cause_recompute] += now - first_step_at;
        log({{"event", "caught-up"}, {"attempt", attempt}, {"step", min_step},
             {"recompute_s", now - first_step_at}});
      }
      if (!first_step_seen && resumed_step >= 0 && max_step > resumed_step) {
        first_step_seen = true;
        first_step_at = now;
        if (pending_restart_from >= 0) {
          // Restart time: from detecting the fault to the first new step.
          log({{"event", "recovered"},
               {"attempt", attempt},
               {"cause", pending_cause},
               {"restart_s", now - pending_restart_from},
               {"resumed_step", resumed_step},
               {"recomputed_steps", std::max<int64_t>(0, failed_at_step - resumed_step)}});
          r.lost_s[pending_cause] += now - pending_restart_from;
          pending_cause_recompute = pending_cause;
          pending_restart_from = -1;
        }
      }
      if (done == pid) {
        detected = now;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          cause = "";
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == kExitNonFinite) {
          cause = "nan";
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == kExitSpikes) {
          cause = "spikes";
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
          cause = "input";
        } else {
          cause = "crash";
        }
        break;
      }
      if (g_interrupted.load()) {
        stop_job(pid, 10);
        cause = "interrupted";
        detected = now;
        break;
      }
      // A hang: some rank's heartbeat has not moved for the timeout (or no
      // heartbeat at all since the start).
      bool hung = false;
      for (const auto& b : beats) {
        if (b.step < 0 ? now - t_attempt > o.startup_timeout_s : now - b.seen > o.hang_timeout_s)
          hung = true;
      }
      if (hung) {
        detected = now;
        status = stop_job(pid, 5);
        cause = "hang";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (cause.empty()) {
      log({{"event", "finished"}, {"attempt", attempt}, {"step", last_step}});
      break;
    }
    // Detection: from the last heartbeat progress to noticing the fault.
    const double detect_s = detected - last_progress;
    json e = {{"event", "fault"},
              {"attempt", attempt},
              {"cause", cause},
              {"last_step", last_step},
              {"detect_s", detect_s},
              {"status", WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status)}};
    log(e);
    if (cause == "input" || cause == "interrupted") {
      r.exit_code = cause == "input" ? 2 : 130;
      break;
    }
    if (attempt > o.max_restarts) {
      log({{"event", "gave-up"}, {"restarts", attempt - 1}});
      r.exit_code = 1;
      break;
    }
    r.lost_s[cause] += 0;  // (restart and recompute counted at recovery)
    pending_restart_from = detected - detect_s;  // the fault's time, as near as we know
    pending_cause = cause;
    failed_at_step = last_step;
    if (cause == "crash" && o.min_np > 0 && np - o.shrink_by >= o.min_np &&
        rows % (np - o.shrink_by) == 0) {
      np -= o.shrink_by;
      args = with_value(args, "-B", "--batch", std::to_string(rows / np));
      log({{"event", "shrink"}, {"np", np}, {"batch", rows / np}});
    }
    const double backoff = std::min(60.0, o.backoff_s * std::pow(2.0, attempt - 1));
    log({{"event", "backoff"}, {"seconds", backoff}});
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  r.wall_s = now_seconds() - t_start;
  r.useful_s = useful_seconds(fs::path(out) / "metrics.jsonl");
  r.goodput = r.wall_s > 0 ? r.useful_s / r.wall_s : 0;
  json lost = r.lost_s;
  log({{"event", "done"},
       {"exit", r.exit_code},
       {"attempts", r.attempts},
       {"wall_s", r.wall_s},
       {"useful_s", r.useful_s},
       {"goodput", r.goodput},
       {"lost_s", lost}});
  return r;
}

}  // namespace anvil::ft
