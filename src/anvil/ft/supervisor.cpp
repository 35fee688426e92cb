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
#include <numeric>
#include <set>
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

std::atomic<int> g_interrupted{0};  // interrupts so far: a second one cuts the grace short
void on_signal(int) {
  g_interrupted.fetch_add(1);
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
int group_size(const std::vector<std::string>& args, const std::string& flag) {
  const std::string v = arg_value(args, flag);
  char* end = nullptr;
  const long n = v.empty() ? 1 : std::strtol(v.c_str(), &end, 10);
  return n >= 1 && (v.empty() || *end == '\0') ? static_cast<int>(n) : 1;
}
int context_parallel(const std::vector<std::string>& args) {
  return group_size(args, "--cp");
}
// What every rank count of the run must be a multiple of: whole
// context-parallel groups and whole expert-parallel groups (--ep).
int rank_multiple(const std::vector<std::string>& args) {
  return std::lcm(group_size(args, "--cp"), group_size(args, "--ep"));
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
    if (now_seconds() - t0 > grace || g_interrupted.load() > 1) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);  // stragglers of the group
  return status;
}

// After the job's group is gone: the ranks on this machine (heartbeat
// pid-R files naming this host and a process running this executable) that
// mpirun's death left running are killed and waited for, at most `wait_s`,
// so no rank of a stopped attempt writes a checkpoint or a heartbeat into
// the next. Ranks on other hosts end when their daemon loses mpirun.
int reap_local_ranks(const fs::path& heartbeat_dir, double wait_s) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<pid_t> alive;
  for (const auto& e : fs::directory_iterator(heartbeat_dir, ec)) {
    if (e.path().filename().string().rfind("pid-", 0) != 0) continue;
    std::ifstream f(e.path());
    long pid = 0;
    std::string name;
    if (!(f >> pid >> name) || name != host || pid <= 1) continue;
    std::error_code exe_ec;
    if (fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", exe_ec) != self || exe_ec) continue;
    ::kill(static_cast<pid_t>(pid), SIGKILL);
    alive.push_back(static_cast<pid_t>(pid));
  }
  const double t0 = now_seconds();
  while (!alive.empty() && now_seconds() - t0 < wait_s) {
    std::erase_if(alive, [](pid_t p) {
      // A zombie (killed, not yet reaped by its parent) counts as gone.
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string pid_text, comm, state;
      return !(stat >> pid_text >> comm >> state) || state == "Z";
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return static_cast<int>(alive.size());
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// Sum of the per-step iteration seconds in metrics.jsonl (the step and the
// work every step of an uninterrupted run also does: the stop vote,
// validation, the metrics line; not checkpoint saves): the steps of the
// final trajectory (a resume drops the lines past its step).
double useful_seconds(const fs::path& metrics) {
  std::ifstream f(metrics);
  double total = 0;
  for (std::string line; std::getline(f, line);) {
    try {
      const json m = json::parse(line);
      total += m.value("iteration_s", m.value("seconds", 0.0));
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
  bool probed = false;             // hosts probed before stopping the job
  std::vector<std::string> down;   // ... and those that did not answer
  double probe_s = 0;
};

// The restart loop of `launch`: one attempt after another, each watched
// through the ranks' heartbeats, with the journal and the time lost per cause.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, std::string out)
      : o_(o),
        out_(std::move(out)),
        heartbeat_dir_(fs::path(out_) / "heartbeat"),
        hosts_(o.hosts),
        np_(o.np),
        cp_(context_parallel(o.train_args)),
        unit_(rank_multiple(o.train_args)),
        args_(o.train_args) {
    r_.journal = o.journal.empty() ? (fs::path(out_) / "journal.jsonl").string() : o.journal;
    if (!o.dry_run) {
      journal_.open(r_.journal, std::ios::app);
      if (!journal_) throw SystemError(r_.journal + ": cannot open for appending");
    }
    const std::string batch_text =
        arg_value(args_, "-B").empty() ? arg_value(args_, "--batch") : arg_value(args_, "-B");
    const std::string accum_text = arg_value(args_, "--accum");
    // The launch's micro-batch, and its rows per step over the data-parallel
    // replicas (np / cp of them): what every later layout keeps.
    batch_ = batch_text.empty() ? 4 : std::stoll(batch_text);
    rows_ = batch_ * (accum_text.empty() ? 1 : std::stoll(accum_text)) * (o.np / cp_);
  }

  // The first attempt's command line, for --dry-run.
  std::string first_command() const { return join(command(1, false)); }

  LaunchResult run() {
    json launch = {{"event", "launch"}, {"np", np_}, {"train", join(args_)}, {"journal", r_.journal}};
    if (!hosts_.empty()) launch["hosts"] = host_list(hosts_);
    log(launch);
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
    if (pending_restart_from_ >= 0) {  // the job ended before recovering from its last fault
      r_.lost_s[pending_cause_] += now_seconds() - pending_restart_from_;
      pending_restart_from_ = -1;
    }
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
    if (np_ > 1 || !hosts_.empty()) {
      cmd = {"mpirun"};
      if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
      if (hosts_.empty()) {
        cmd.push_back("--oversubscribe");
      } else {
        // Ranks fill the hosts in order (rank -> host, as the journal names them).
        cmd.insert(cmd.end(), {"--host", host_list(hosts_)});
        if (std::find(o_.mpirun_args.begin(), o_.mpirun_args.end(), "--map-by") ==
            o_.mpirun_args.end())
          cmd.insert(cmd.end(), {"--map-by", "slot"});
      }
      cmd.insert(cmd.end(), {"-np", std::to_string(np_)});
      cmd.insert(cmd.end(), o_.mpirun_args.begin(), o_.mpirun_args.end());
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
    const auto cmd = command(attempt, has_checkpoint);
    json start = {{"event", "start"}, {"attempt", attempt}, {"np", np_}, {"resume", has_checkpoint}};
    if (!hosts_.empty()) start["hosts"] = host_list(hosts_);
    start["command"] = join(cmd);
    if (attempt == 1) r_.command = join(cmd);
    log(start);
    const double t_attempt = now_seconds();
    const pid_t pid = spawn(cmd);
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
        // An unreadable beat (-1) after a readable one keeps the last step.
        if (s != b.step && (s >= 0 || b.step < 0)) {
          b.step = s;
          b.seen = now;
          end.last_progress = now;
        }
      }
      progress(beats, attempt, now, end);
      if (done == pid) {
        end.detected = now;
        end.cause = cause_of(end.status);
        if (end.cause == "stopped" && g_interrupted.load() > 0) end.cause = "interrupted";
        if (!end.cause.empty()) reap_local_ranks(heartbeat_dir_, 10);
        return end;
      }
      if (g_interrupted.load() > 0) {
        // The job finishes its step and writes its checkpoint meanwhile.
        stop(pid, o_.stop_grace_s);
        end.cause = "interrupted";
        end.detected = now;
        return end;
      }
      if (watch_lost_hosts(now)) {
        // The checkpoint is committed: the steps past it are recomputed
        // anyway, so the job is killed rather than asked to save again.
        end.detected = now;
        end.status = stop(pid, 0);
        end.cause = "grow";
        return end;
      }
      // A hang: some rank's heartbeat has not moved for the timeout (or no
      // heartbeat at all since the start).
      for (const auto& b : beats) {
        if (b.step < 0 ? now - t_attempt > o_.startup_timeout_s
                       : now - b.seen > o_.hang_timeout_s) {
          end.detected = now;
          end.cause = "hang";
          // A hung job cannot stop at a step boundary (the trainer's clean
          // stop), so it is killed. Across hosts the probe comes first.
          if (!hosts_.empty()) {
            end.probed = true;
            end.down = unreachable_hosts();
            end.probe_s = now_seconds() - now;
          }
          end.status = stop(pid, 0);
          return end;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Stops the job (stop_job) and then its ranks left on this machine.
  int stop(pid_t pid, double grace) {
    const int status = stop_job(pid, grace);
    if (const int left = reap_local_ranks(heartbeat_dir_, 10); left > 0)
      log({{"event", "warning"}, {"what", std::to_string(left) + " ranks of the stopped job still run"}});
    return status;
  }

  // The newest checkpoint's step; -1 when none.
  int64_t newest_checkpoint() const {
    const auto dirs = ckpt::checkpoint_dirs(out_);
    int64_t newest = -1;
    for (const auto& d : dirs) {
      const std::string name = fs::path(d).filename().string();  // step-00000030
      if (name.rfind("step-", 0) == 0) newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    }
    return newest;
  }

  // While hosts are lost: probes them every probe_every_s; once one answers,
  // true as soon as the job has committed a checkpoint after that (the
  // restart that grows back then recomputes nothing it did not have to).
  bool watch_lost_hosts(double now) {
    if (lost_.empty() || o_.min_ranks == 0) return false;
    if (back_.empty()) {
      if (now < next_probe_) return false;
      next_probe_ = now + o_.probe_every_s;
      for (const auto& h : o_.hosts) {
        if (!lost_.count(h.name) || !host_answers(h.name, o_.probe_port, o_.probe_timeout_s))
          continue;
        back_.push_back(h.name);
      }
      if (back_.empty()) return false;
      back_checkpoint_ = newest_checkpoint();
      log({{"event", "host-back"}, {"hosts", back_}, {"checkpoint", back_checkpoint_},
           {"grow", "at the next checkpoint"}});
      return false;
    }
    return newest_checkpoint() > back_checkpoint_;
  }

  // The hosts of the current layout that do not answer the probe.
  std::vector<std::string> unreachable_hosts() const {
    std::vector<std::string> down;
    std::vector<std::thread> probes;
    std::vector<char> up(hosts_.size(), 0);
    for (size_t i = 0; i < hosts_.size(); ++i)
      probes.emplace_back([&, i] { up[i] = host_answers(hosts_[i].name, o_.probe_port, o_.probe_timeout_s); });
    for (auto& t : probes) t.join();
    for (size_t i = 0; i < hosts_.size(); ++i)
      if (!up[i]) down.push_back(hosts_[i].name);
    return down;
  }

  // The ranks `host` holds in the current layout (hosts filled in order).
  std::vector<int> ranks_of(const std::string& host) const {
    std::vector<int> ranks;
    int first = 0;
    for (const auto& h : hosts_) {
      if (h.name == host)
        for (int r = first; r < first + h.slots; ++r) ranks.push_back(r);
      first += h.slots;
    }
    return ranks;
  }

  // -B and --accum for np_ ranks at the launch's rows per step: the launch's
  // micro-batch (so a rank's activation memory does not grow) with more
  // accumulation on fewer replicas, or the largest smaller micro-batch that
  // splits the replica's rows; false when the rows do not split over the
  // replicas.
  bool rescale_batch() {
    if (np_ % unit_ != 0 || rows_ % (np_ / cp_) != 0) return false;
    const int64_t per_replica = rows_ / (np_ / cp_);
    int64_t batch = std::min(batch_, per_replica);
    while (per_replica % batch != 0) --batch;
    args_ = with_value(args_, "-B", "--batch", std::to_string(batch));
    args_ = with_value(args_, "--accum", "--accum", std::to_string(per_replica / batch));
    return true;
  }

  // The journal's words for the current split: micro-batch and accumulation.
  json split() const {
    return {{"batch", std::stoll(arg_value(args_, "-B").empty() ? arg_value(args_, "--batch")
                                                                 : arg_value(args_, "-B"))},
            {"accum", std::stoll(arg_value(args_, "--accum"))}};
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
      in_a_row_ = 0;  // the job got past the fault: the next one backs off from the start
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
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitStraggler) return "straggler";
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitDiverged) return "diverged";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) return "input";
    // anvil train stopped early by SIGINT/SIGTERM (128 + it), its checkpoint
    // written: a preemption when the supervisor itself was not interrupted.
    if (WIFEXITED(status) &&
        (WEXITSTATUS(status) == 128 + SIGINT || WEXITSTATUS(status) == 128 + SIGTERM))
      return "stopped";
    return "crash";
  }

  // A lost host answers again and a checkpoint followed: the next attempt
  // runs on every host not excluded that answers.
  bool grow(int attempt, const AttemptEnd& end) {
    std::vector<Host> next;
    for (const auto& h : o_.hosts) {
      const bool active = std::any_of(hosts_.begin(), hosts_.end(),
                                      [&](const Host& a) { return a.name == h.name; });
      if (active || (lost_.count(h.name) && host_answers(h.name, o_.probe_port, o_.probe_timeout_s)))
        next.push_back(h);
    }
    const auto old_hosts = hosts_;
    const int old_np = np_;
    hosts_ = next;
    np_ = total_slots(hosts_);
    back_.clear();
    if (!rescale_batch()) {
      log({{"event", "grow-skipped"}, {"np", np_},
           {"why", "the global batch does not split over " + std::to_string(np_ / cp_) + " replicas"}});
      hosts_ = old_hosts;
      np_ = old_np;
      rescale_batch();
    } else {
      for (const auto& h : hosts_) lost_.erase(h.name);
      json grow = {{"event", "grow"}, {"attempt", attempt}, {"np", np_}, {"hosts", host_list(hosts_)},
                   {"checkpoint", newest_checkpoint()}, {"stop_s", now_seconds() - end.detected}};
      grow.update(split());
      log(grow);
    }
    pending_restart_from_ = end.detected;
    pending_cause_ = "grow";
    failed_at_step_ = end.last_step;
    return true;
  }

  // Journals the fault and prepares the next attempt; false: stop here.
  bool recover(int attempt, const AttemptEnd& end) {
    if (end.cause == "grow") return grow(attempt, end);
    // Detection: from the last heartbeat progress to noticing the fault.
    const double detect_s = end.detected - end.last_progress;
    json fault = {{"event", "fault"},
                  {"attempt", attempt},
                  {"cause", end.cause},
                  {"last_step", end.last_step},
                  {"detect_s", detect_s},
                  {"status", WIFEXITED(end.status) ? WEXITSTATUS(end.status) : -WTERMSIG(end.status)}};
    // Across hosts: which of them stopped answering. A host that does not
    // answer (a link down, a machine gone: from here they look the same)
    // is named with its ranks; every host answering leaves a dead process
    // or a hang on a live host.
    std::vector<std::string> down;
    if (!hosts_.empty() && end.cause != "input" && end.cause != "interrupted") {
      const double t_probe = now_seconds();
      down = end.probed ? end.down : unreachable_hosts();
      fault["probe_s"] = end.probed ? end.probe_s : now_seconds() - t_probe;
      if (!down.empty()) {
        json named = json::array();
        for (const auto& h : down) named.push_back({{"host", h}, {"ranks", ranks_of(h)}});
        fault["unreachable"] = named;
        fault["seen_as"] = end.cause;
        fault["cause"] = "unreachable";
      }
    }
    // A straggler the trainer stopped for (--straggler-action exclude): its
    // rank, and across hosts its host, left out of the next attempt.
    int straggler = -1;
    std::string straggler_host;
    if (end.cause == "straggler") {
      std::ifstream f(heartbeat_dir_ / "straggler");
      f >> straggler;
      fault["rank"] = straggler;
      int first = 0;
      for (const auto& h : hosts_) {
        if (straggler >= first && straggler < first + h.slots) straggler_host = h.name;
        first += h.slots;
      }
      if (!straggler_host.empty()) fault["host"] = straggler_host;
    }
    const std::string cause = fault["cause"];
    log(fault);
    if (end.cause == "input" || end.cause == "interrupted") {
      r_.exit_code = end.cause == "input" ? 2 : 130;
      return false;
    }
    ++in_a_row_;
    if (++restarts_ > o_.max_restarts) {
      log({{"event", "gave-up"}, {"restarts", restarts_ - 1}});
      r_.exit_code = 1;
      return false;
    }
    r_.lost_s[cause] += 0;  // (restart and recompute counted at recovery)
    // A restart that failed before its first new step: all of it was lost.
    if (pending_restart_from_ >= 0)
      r_.lost_s[pending_cause_] += end.detected - detect_s - pending_restart_from_;
    pending_restart_from_ = end.detected - detect_s;  // the fault's time, as near as we know
    pending_cause_ = cause;
    failed_at_step_ = end.last_step;
    if (!straggler_host.empty() && o_.min_ranks > 0 &&
        std::find(down.begin(), down.end(), straggler_host) == down.end()) {
      down.push_back(straggler_host);
      log({{"event", "exclude"}, {"host", straggler_host},
           {"why", "straggler rank " + std::to_string(straggler)}});
      lost_.erase(straggler_host);
    }
    if (!down.empty() && o_.min_ranks > 0) {
      for (const auto& h : down) {
        if (h == straggler_host) {
          failures_[h] = 2;
          continue;
        }
        if (++failures_[h] >= 2) {
          lost_.erase(h);
          log({{"event", "exclude"}, {"host", h}, {"why", "unreachable twice"}});
        } else {
          lost_.insert(h);
        }
      }
      std::vector<Host> survivors;
      for (const auto& h : hosts_)
        if (std::find(down.begin(), down.end(), h.name) == down.end()) survivors.push_back(h);
      const int n = total_slots(survivors);
      const bool fits = n >= o_.min_ranks && n % unit_ == 0 && rows_ % (n / cp_) == 0;
      if (!fits) {
        log({{"event", "gave-up"},
             {"why", std::to_string(n) + " ranks answer; --min-ranks " +
                         std::to_string(o_.min_ranks) + ", a multiple of " + std::to_string(unit_) +
                         " ranks (whole context- and expert-parallel groups) and the global "
                         "batch of " +
                         std::to_string(rows_) + " rows split over the replicas are needed"}});
        r_.exit_code = 1;
        return false;
      }
      hosts_ = survivors;
      np_ = n;
      rescale_batch();
      next_probe_ = now_seconds() + o_.probe_every_s;
      json shrink = {{"event", "shrink"}, {"np", np_}, {"cp", cp_}, {"hosts", host_list(hosts_)}};
      shrink.update(split());
      log(shrink);
    }
    // One machine: a smaller grid keeps the context- and expert-parallel
    // groups whole: np - shrink_by must be a multiple of both, and the rows
    // must split over its replicas.
    const int smaller = np_ - o_.shrink_by;
    if (o_.hosts.empty() && (end.cause == "crash" || end.cause == "straggler") &&
        o_.min_ranks > 0 && smaller >= o_.min_ranks && smaller % unit_ == 0 &&
        rows_ % (smaller / cp_) == 0) {
      np_ = smaller;
      rescale_batch();
      json shrink = {{"event", "shrink"}, {"np", np_}, {"cp", cp_}};
      shrink.update(split());
      log(shrink);
    }
    const double backoff = std::min(60.0, o_.backoff_s * std::pow(2.0, in_a_row_ - 1));
    log({{"event", "backoff"}, {"seconds", backoff}});
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    return true;
  }

  const LaunchOptions& o_;
  std::string out_;
  fs::path heartbeat_dir_;
  std::vector<Host> hosts_;  // the current layout's hosts (empty: this machine)
  int np_;
  int cp_;    // context-parallel ranks per group (the train arguments' --cp)
  int unit_;  // every rank count is a multiple of it (rank_multiple)
  std::vector<std::string> args_;
  int64_t batch_ = 4, rows_ = 0;  // the launch's micro-batch and rows per step
  LaunchResult r_;
  std::ofstream journal_;
  double t_start_ = now_seconds();
  double pending_restart_from_ = -1;  // detection time of the fault being recovered
  std::string pending_cause_, pending_cause_recompute_;
  int64_t failed_at_step_ = 0;
  bool first_step_seen_ = false, recomputing_ = false;
  double first_step_at_ = 0;
  int64_t resumed_step_ = -1;
  int restarts_ = 0;                   // after faults (growing back is not one)
  int in_a_row_ = 0;                   // faults since the job last got past one (backoff)
  std::map<std::string, int> failures_;  // a host's times unreachable
  std::set<std::string> lost_;           // unreachable once: probed, may come back
  std::vector<std::string> back_;        // lost hosts that answer again
  int64_t back_checkpoint_ = -1;         // the newest checkpoint when they did
  double next_probe_ = 0;
};

}  // namespace

std::vector<std::string> with_value(std::vector<std::string> args, const std::string& flag,
                                    const std::string& alias, const std::string& value) {
  for (size_t i = 0; i < args.size(); ++i) {
    if ((args[i] == flag || args[i] == alias) && i + 1 < args.size()) {
      args[i + 1] = value;
      return args;
    }
    for (const auto& f : {flag, alias})
      if (args[i].rfind(f + "=", 0) == 0) {
        args[i] = f + "=" + value;
        return args;
      }
  }
  args.push_back(flag);
  args.push_back(value);
  return args;
}

LaunchResult launch(const LaunchOptions& options) {
  LaunchOptions o = options;
  const std::string out = arg_value(o.train_args, "--out");
  if (out.empty())
    throw InputError("launch: the train arguments need --out RUN (checkpoints to restart from)");
  if (!o.hosts.empty() && o.np > 0 && o.np != total_slots(o.hosts))
    throw InputError("--np " + std::to_string(o.np) + ": expected the hosts' " +
                     std::to_string(total_slots(o.hosts)) + " slots (" + host_list(o.hosts) +
                     "), or leave it out");
  if (o.np == 0) o.np = o.hosts.empty() ? 1 : total_slots(o.hosts);
  if (o.np < 1) throw InputError("--np: expected >= 1");
  if (o.min_ranks > o.np) throw InputError("--min-ranks: expected <= --np " + std::to_string(o.np));
  // A recipe plans its phases' steps for the rank count (and sets -B and
  // --accum itself): a smaller run could not resume it.
  if (o.min_ranks > 0 && o.min_ranks < o.np && !arg_value(o.train_args, "--recipe").empty())
    throw InputError("--min-ranks " + std::to_string(o.min_ranks) +
                     ": a --recipe run restarts on its --np " + std::to_string(o.np) +
                     " ranks only (its phases' steps are planned for that count); expected "
                     "--min-ranks 0 or " +
                     std::to_string(o.np));
  if (const int unit = rank_multiple(o.train_args); o.np % unit != 0)
    throw InputError("--np " + std::to_string(o.np) + ": expected a multiple of " +
                     std::to_string(unit) +
                     " (whole context- and expert-parallel groups of the train arguments' --cp "
                     "and --ep)");
  if (const int unit = rank_multiple(o.train_args);
      o.min_ranks > 0 && (o.np - unit < o.min_ranks || o.np - unit < 1))
    throw InputError("--min-ranks " + std::to_string(o.min_ranks) +
                     ": no smaller run fits: it would need a multiple of " + std::to_string(unit) +
                     " ranks (whole context- and expert-parallel groups of the train arguments' "
                     "--cp and --ep) from --min-ranks to --np " +
                     std::to_string(o.np) + " - 1");
  for (const char* flag : {"--resume", "--heartbeat", "--inject"}) {
    if (!arg_value(o.train_args, flag).empty())
      throw InputError(std::string("launch: ") + flag +
                       " among the train arguments; the supervisor sets it");
  }
  if (o.dry_run) {
    LaunchResult r;
    r.command = Supervisor(o, out).first_command();
    return r;
  }
  const bool fresh = !fs::exists(out);
  fs::create_directories(out);
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);
  g_interrupted.store(0);
  LaunchResult r = Supervisor(o, out).run();
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  // The first attempt refused its input: nothing trained, so a run
  // directory this launch made (its journal and heartbeats) goes too.
  if (fresh && r.exit_code == 2 && r.attempts == 1) {
    std::error_code ignored;
    fs::remove_all(out, ignored);
    r.journal.clear();
  }
  return r;
}

}  // namespace anvil::ft
