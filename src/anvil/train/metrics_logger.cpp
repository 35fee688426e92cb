#include "anvil/train/metrics_logger.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"

namespace anvil::train {
namespace {

using json = nlohmann::json;

std::string format_eta(double seconds) {
  char buf[32];
  const auto s = static_cast<long long>(seconds);
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const json& m) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& [key, tag] : {std::pair{"loss", "train/loss"},
                                 {"lr", "train/lr"},
                                 {"grad_norm", "train/grad_norm"},
                                 {"tokens_per_s", "perf/tokens_per_s"},
                                 {"mfu", "perf/mfu"},
                                 {"val_loss", "val/loss"}})
    if (m.contains(key)) v.emplace_back(tag, m[key].get<double>());
  const json parts = m.value("parts_s", json::object());
  for (const auto& [part, seconds] : parts.items())
    v.emplace_back("perf/" + part + "_s", seconds.get<double>());
  for (const auto& l : m.value("router", json::array())) {
    const std::string layer = "router/layer" + l["layer"].dump() + "/";
    for (const char* k : {"max_over_min", "skip_rate", "entropy"})
      if (l.contains(k) && l[k].is_number()) v.emplace_back(layer + k, l[k].get<double>());
  }
  return v;
}

// metrics.jsonl keeps one line per step of the trajectory this run
// continues: lines past `start` (a run that went further before this one
// resumed from an earlier step, or a fresh run in an old directory) go. The
// whole previous file stays as metrics.jsonl.N (a hard link, else a copy)
// before the kept lines replace it atomically (temporary, fsync, rename).
void truncate_metrics(const std::string& path, int64_t start) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const std::string old = read_file(path);
  std::string kept;
  bool dropped = false;
  for (size_t pos = 0; pos < old.size();) {
    size_t end = old.find('\n', pos);
    const bool whole = end != std::string::npos;  // a line cut by a crash is not
    if (!whole) end = old.size();
    const std::string_view line(old.data() + pos, end - pos);
    const json m = whole ? json::parse(line, nullptr, /*allow_exceptions=*/false) : json();
    const auto step = m.is_object() ? m.find("step") : m.end();
    if (step != m.end() && step->is_number_integer() && step->get<int64_t>() <= start) {
      kept.append(line).push_back('\n');
    } else {
      dropped = true;
    }
    pos = end + 1;
  }
  if (!dropped) return;
  for (int i = 1;; ++i) {
    const std::string rotated = path + "." + std::to_string(i);
    if (::link(path.c_str(), rotated.c_str()) == 0) break;
    if (errno == EEXIST) continue;
    write_file_atomic(rotated, old);  // a file system without hard links
    break;
  }
  write_file_atomic(path, kept);
}

MetricsLogger::MetricsLogger(const MetricsOptions& options, const PhaseOptions& phase,
                             std::string out_dir, int rank, int world, int ep, bool tty)
    : o_(options),
      phase_(phase),
      out_dir_(std::move(out_dir)),
      rank_(rank),
      world_(world),
      ep_(ep),
      tty_(tty) {}

void MetricsLogger::open(int64_t start, int64_t steps) {
  start_ = start;
  steps_ = steps;
  if (rank_ != 0) return;
  if (!out_dir_.empty()) {
    const std::string path = out_dir_ + "/metrics.jsonl";
    truncate_metrics(path, start);
    file_ = std::make_unique<AppendFile>(path);
  }
  if (!o_.tensorboard.empty()) events_ = std::make_unique<EventWriter>(o_.tensorboard);
}

json MetricsLogger::record(const StepStats& s, const StepReport& r) const {
  json m = {{"step", s.step},
            {"loss", s.loss},
            {"lr", s.lr},
            {"grad_norm", s.grad_norm},
            {"seconds", s.seconds},
            {"tokens_per_s", r.tokens_per_step / s.seconds},
            {"mfu", r.mfu},
            {"tokens", phase_.tokens_before +
                           (s.step - phase_.first_step) * static_cast<int64_t>(r.tokens_per_step)}};
  if (s.skipped) m["skipped"] = true;  // a loss spike: the update was not applied
  if (!phase_.name.empty()) m["phase"] = phase_.name;
  if (r.val_loss >= 0) m["val_loss"] = r.val_loss;
  if (s.save_wait_seconds > 1e-4) m["save_wait_s"] = s.save_wait_seconds;
  if (r.iteration_seconds > 0) m["iteration_s"] = r.iteration_seconds;
  if (world_ > 1) {
    m["ranks"] = world_;
    m["comm_s"] = s.comm_seconds;
    m["comm_exposed_s"] = s.exposed_seconds;
    if (ep_ > 1) m["alltoall_s"] = s.alltoall_seconds;
    if (s.context_seconds > 0) m["context_s"] = s.context_seconds;
    if (s.context_halo_seconds > 0) m["context_halo_s"] = s.context_halo_seconds;
    m["rank_peak_rss_bytes"] = r.rank_rss;
    m["rank_comm_s"] = r.rank_comm;
    m["rank_comm_exposed_s"] = r.rank_exposed;
    m["rank_compute_s"] = r.rank_compute;
    m["rank_wait_s"] = r.rank_wait;
  }
  if (s.forward_backward_seconds > 0) m["parts_s"] = step_parts_json(s);
  m.update(r.model_metrics);
  return m;
}

json step_parts_json(const StepStats& s) {
  json j = json::object();
  double inside = 0;
  for (size_t i = 0; i < kStepParts; ++i) {
    j[step_part_name(static_cast<StepPart>(i))] = s.parts[i];
    inside += s.parts[i];
  }
  j["other"] = std::max(0.0, s.forward_backward_seconds - inside);
  j["optimizer"] = s.optimizer_seconds;
  return j;
}

std::string MetricsLogger::progress_line(const StepStats& s, const StepReport& r) const {
  const double eta = s.seconds * static_cast<double>(steps_ - s.step);
  char line[384];
  std::snprintf(line, sizeof line,
                "step %lld/%lld | loss %.4f | lr %.2e | grad-norm %.3f | %.0f tok/s | MFU "
                "%.1f%% | ETA %s",
                static_cast<long long>(s.step), static_cast<long long>(steps_), s.loss, s.lr,
                s.grad_norm, r.tokens_per_step / s.seconds, 100 * r.mfu, format_eta(eta).c_str());
  std::string note = r.model_note;
  if (world_ > 1) {
    char c[96];
    if (ep_ > 1) {
      std::snprintf(c, sizeof c, "comm %.0f ms (%.0f exposed) | all-to-all %.0f ms",
                    1e3 * s.comm_seconds, 1e3 * s.exposed_seconds, 1e3 * s.alltoall_seconds);
    } else {
      std::snprintf(c, sizeof c, "comm %.0f ms (%.0f exposed)", 1e3 * s.comm_seconds,
                    1e3 * s.exposed_seconds);
    }
    note = note.empty() ? c : note + " | " + c;
    if (r.rank_compute.size() > 1) {  // the slowest rank's compute against the median
      const auto slowest = std::max_element(r.rank_compute.begin(), r.rank_compute.end());
      std::vector<double> others(r.rank_compute.begin(), slowest);
      others.insert(others.end(), slowest + 1, r.rank_compute.end());
      std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
      std::snprintf(c, sizeof c, "slowest rank %d compute %.0f ms (others' median %.0f)",
                    static_cast<int>(slowest - r.rank_compute.begin()), 1e3 * *slowest,
                    1e3 * others[others.size() / 2]);
      note += std::string(" | ") + c;
    }
  }
  if (!note.empty())
    std::strncat(line, (" | " + note).c_str(), sizeof line - std::strlen(line) - 1);
  return line;
}

void MetricsLogger::log(const StepStats& s, const StepReport& r) {
  if (rank_ != 0) return;
  if (file_ || events_) {
    const json m = record(s, r);
    if (file_ && !file_->append(m.dump() + "\n") && lines_lost_++ == 0)
      // The run goes on (its state is in memory and checkpoints); the file
      // stays whole lines, missing the steps the disk had no room for.
      std::fprintf(stderr, "anvil: warning: %s: the line of step %lld not written (%s); "
                   "training on, lines are dropped until there is space\n",
                   file_->path().c_str(), static_cast<long long>(s.step),
                   std::strerror(file_->error()));
    if (events_) {
      try {
        events_->scalars(s.step, tensorboard_scalars(m));
      } catch (const SystemError& e) {  // as for the lines: warn once, train on
        if (events_lost_++ == 0)
          std::fprintf(stderr,
                       "anvil: warning: %s (step %lld); training on, TensorBoard "
                       "events are dropped until there is space\n",
                       e.what(), static_cast<long long>(s.step));
      }
    }
  }
  if (o_.quiet) return;
  const bool last = s.step == steps_;
  const std::string line = progress_line(s, r);
  if (tty_) {
    std::printf("\r%s\x1b[K", line.c_str());
    if (r.val_loss >= 0 || last) std::printf("\n");
  } else if (s.step % std::max<int64_t>(1, o_.log_every) == 0 || last || s.step == start_ + 1) {
    std::printf("%s\n", line.c_str());
  }
  if (r.val_loss >= 0)
    std::printf("validation loss %.4f at step %lld\n", r.val_loss, static_cast<long long>(s.step));
  std::fflush(stdout);
}

}  // namespace anvil::train
