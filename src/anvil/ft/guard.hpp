// The fault guard of a training run: a heartbeat file per rank for a
// supervisor (anvil launch), the check that the loss and gradient norm are
// finite, and the loss-spike policy (skip a spiking update; roll back after
// several in a row). Its window of recent losses is part of a checkpoint, so
// a resumed run skips exactly what the uninterrupted one would.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/options.hpp"

namespace anvil::ft {

struct GuardOptions {
  std::string heartbeat;
  double spike_z = 6.0;
  int spike_window = 20;
  int max_spikes = 3;
  double straggler_factor = 2.0;
  int straggler_steps = 5;
  std::string straggler_action = "warn";
  template <class V>
  void describe(V& v) {
    v({.name = "heartbeat",
       .help = "Directory where each rank writes rank-R (step, time, loss) after every step "
               "(anvil launch watches it)"},
      heartbeat, output_dir_check());
    v({.name = "spike_z",
       .help = "A loss this many standard deviations above the last --spike-window losses skips "
               "its update (0: off)"},
      spike_z, at_least(0.0));
    v({.name = "spike_window", .help = "Losses the spike check looks back on"}, spike_window,
      in_range(3, 100000));
    v({.name = "max_spikes",
       .help = "Spikes in a row that end the run with status 11 (roll back to the last "
               "checkpoint); a NaN/Inf loss ends it with status 10"},
      max_spikes, at_least(1));
    v({.name = "straggler_factor",
       .help = "Name a rank whose compute time per step (its step less its waits in "
               "collectives) exceeds this multiple of the other ranks' median for "
               "--straggler-steps steps in a row (0: no check)"},
      straggler_factor, at_least(0.0));
    v({.name = "straggler_steps", .help = "Slow steps in a row before a straggler is named"},
      straggler_steps, at_least(1));
    v({.name = "straggler_action",
       .help = "warn: name the straggler and go on; exclude: also checkpoint at that step, write "
               "the rank into the heartbeat directory's 'straggler' file and exit with status 12, "
               "for anvil launch to restart without it"},
      straggler_action, one_of({"warn", "exclude"}));
  }
};

class FaultGuard {
 public:
  // `warn`: print skipped updates (rank 0 of a run that is not quiet).
  FaultGuard(GuardOptions options, int rank, bool warn);
  // Writes DIR/rank-R "STEP UNIX_TIME LOSS" (no-op without a heartbeat
  // directory); a NaN loss marks where this attempt starts (DIR/start-R too).
  void heartbeat(int64_t step, double loss) const;
  // TrainingFault (exit kExitNonFinite) unless the loss and norm of `step` are finite.
  void check_finite(int64_t step, double loss, double grad_norm) const;
  // True when `loss` spikes (its update is to be skipped); TrainingFault
  // (exit kExitSpikes) on the max_spikes-th in a row.
  bool is_spike(int64_t step, double loss);
  // The spike window, for state.json, and back.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  GuardOptions o_;
  int rank_;
  bool warn_;
  std::vector<double> recent_losses_;
  int spikes_in_a_row_ = 0;
};

}  // namespace anvil::ft
