#include "anvil/ft/guard.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "anvil/ft/faults.hpp"

namespace anvil::ft {

FaultGuard::FaultGuard(GuardOptions options, int rank, bool warn)
    : o_(std::move(options)), rank_(rank), warn_(warn) {
  if (o_.heartbeat.empty()) return;
  std::filesystem::create_directories(o_.heartbeat);
  // Who this rank is, for a supervisor that must see it gone before the next
  // attempt: "PID HOSTNAME".
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  if (FILE* f = std::fopen((o_.heartbeat + "/pid-" + std::to_string(rank_)).c_str(), "w")) {
    std::fprintf(f, "%ld %s\n", static_cast<long>(::getpid()), host);
    std::fclose(f);
  }
}

void FaultGuard::heartbeat(int64_t step, double loss) const {
  if (o_.heartbeat.empty()) return;
  // Small, renamed into place (no fsync: a supervisor on this machine reads it).
  char line[128];
  const auto unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::snprintf(line, sizeof line, "%lld %.3f %.9g\n", static_cast<long long>(step), unix_s, loss);
  const std::string path = o_.heartbeat + "/rank-" + std::to_string(rank_);
  const std::string tmp = path + ".tmp";
  if (std::isnan(loss)) {  // the first: where this attempt starts
    const std::string start = o_.heartbeat + "/start-" + std::to_string(rank_);
    if (FILE* f = std::fopen(start.c_str(), "w")) {
      std::fputs(line, f);
      std::fclose(f);
    }
  }
  // Renamed only when written whole: on a full disk the supervisor keeps
  // reading the last beat (an empty file would read as no step at all,
  // which it takes for a rank that never started: a hang).
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    const bool written = std::fputs(line, f) >= 0 && std::fflush(f) == 0;
    if (std::fclose(f) == 0 && written)
      std::rename(tmp.c_str(), path.c_str());
    else
      std::remove(tmp.c_str());
  }
}

void FaultGuard::check_finite(int64_t step, double loss, double grad_norm) const {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) return;
  char what[160];
  std::snprintf(what, sizeof what,
                "step %lld: loss %.6g, gradient norm %.6g (not finite); roll back to the last "
                "checkpoint",
                static_cast<long long>(step), loss, grad_norm);
  throw TrainingFault(what, kExitNonFinite);
}

bool FaultGuard::is_spike(int64_t step, double loss) {
  if (o_.spike_z <= 0) return false;
  const auto n = recent_losses_.size();
  bool spike = false;
  if (static_cast<int>(n) >= o_.spike_window) {
    double mean = 0, var = 0;
    for (double x : recent_losses_) mean += x;
    mean /= static_cast<double>(n);
    for (double x : recent_losses_) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / static_cast<double>(n - 1));
    spike = sd > 0 && (loss - mean) / sd > o_.spike_z;
  }
  if (!spike) {
    spikes_in_a_row_ = 0;
    recent_losses_.push_back(loss);
    if (static_cast<int>(recent_losses_.size()) > o_.spike_window)
      recent_losses_.erase(recent_losses_.begin());
    return false;
  }
  if (++spikes_in_a_row_ >= o_.max_spikes) {
    throw TrainingFault("step " + std::to_string(step) + ": " + std::to_string(spikes_in_a_row_) +
                            " loss spike(s) in a row; roll back to the last checkpoint",
                        kExitSpikes);
  }
  if (warn_)
    std::fprintf(
        stderr, "\nanvil: warning: step %lld: loss %.4f spikes above the last %d; update skipped\n",
        static_cast<long long>(step), loss, o_.spike_window);
  return true;
}

nlohmann::json FaultGuard::state() const {
  return {{"recent_losses", recent_losses_}, {"spikes_in_a_row", spikes_in_a_row_}};
}

void FaultGuard::restore(const nlohmann::json& state) {
  if (state.contains("recent_losses") && state["recent_losses"].is_array())
    recent_losses_ = state["recent_losses"].get<std::vector<double>>();
  spikes_in_a_row_ = state.value("spikes_in_a_row", 0);
}

}  // namespace anvil::ft
