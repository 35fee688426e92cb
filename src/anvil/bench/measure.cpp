#include "anvil/bench/measure.hpp"

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <limits>

namespace anvil::bench {

double Samples::percentile(double p) const {
  if (seconds.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> s = seconds;
  std::sort(s.begin(), s.end());
  const double pos = p / 100.0 * static_cast<double>(s.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (pos - static_cast<double>(lo)) * (s[hi] - s[lo]);
}

double Samples::median() const {
  return percentile(50.0);
}

double Samples::best() const {
  if (seconds.empty()) return std::numeric_limits<double>::quiet_NaN();
  return *std::min_element(seconds.begin(), seconds.end());
}

Samples time_calls(const std::function<void()>& body, const TimingPolicy& policy) {
  for (int i = 0; i < policy.warmup; ++i) body();
  Samples samples;
  double total = 0.0;
  while (static_cast<int>(samples.seconds.size()) < policy.max_samples &&
         (total < policy.min_seconds ||
          static_cast<int>(samples.seconds.size()) < policy.min_samples)) {
    const double t0 = now_seconds();
    body();
    const double dt = now_seconds() - t0;
    samples.seconds.push_back(dt);
    total += dt;
  }
  return samples;
}

}  // namespace anvil::bench
