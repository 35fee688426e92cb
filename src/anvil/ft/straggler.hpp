// Stragglers: a rank whose compute time per step (its step time less the
// time it waited in collectives) stays above `factor` times the median of
// the other ranks' for `steps` steps in a row is named. Rank 0 feeds it the
// gathered per-rank numbers each step; it decides, the trainer reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>


namespace anvil::ft {

struct Straggler {
  int rank = 0;
  int64_t since_step = 0;     // the first slow step of the run of slow steps
  double compute_s = 0;       // its compute time at the naming step
  double others_median_s = 0; // the other ranks' median then
};

class StragglerWatch {
 public:
  // factor 0: off.
  StragglerWatch(double factor, int steps) : factor_(factor), steps_(steps) {}
  // One step's compute seconds per rank. Returns the straggler once, on the
  // step its run of slow steps reaches straggler_steps (again only after it
  // recovered and slowed down anew).
  std::optional<Straggler> feed(int64_t step, const std::vector<double>& compute_s);

 private:
  double factor_;
  int steps_;
  std::vector<int> slow_run_;        // consecutive slow steps per rank
  std::vector<bool> named_;          // named during its current run
};

}  // namespace anvil::ft
