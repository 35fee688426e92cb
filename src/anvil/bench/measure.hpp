// Timing for microbenchmarks: run a body until a minimum time has passed and
// keep every sample, so tables can show the median (noise-robust) and the
// best. Tests never call this; benchmarks only.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "anvil/base/clock.hpp"
#include "anvil/base/progress.hpp"

namespace anvil::bench {

struct Samples {
  std::vector<double> seconds;  // one per timed call, in call order
  double median() const;
  double best() const;
  double percentile(double p) const;  // p in [0, 100]
};

struct TimingPolicy {
  double min_seconds = 0.2;  // keep sampling until this much time was timed
  int min_samples = 3;
  int max_samples = 1000;
  int warmup = 1;
};

// Calls `body` policy.warmup times untimed, then times it call by call.
Samples time_calls(const std::function<void()>& body, const TimingPolicy& policy);

using anvil::now_seconds;

using anvil::progress_line;  // base/progress.hpp

}  // namespace anvil::bench
