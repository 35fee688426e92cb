#include "anvil/ft/straggler.hpp"

#include <algorithm>

namespace anvil::ft {

std::optional<Straggler> StragglerWatch::feed(int64_t step, const std::vector<double>& compute_s) {
  const size_t n = compute_s.size();
  if (!(factor_ > 0) || n < 2) return std::nullopt;
  slow_run_.resize(n, 0);
  named_.resize(n, false);
  std::optional<Straggler> found;
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> others;
    for (size_t q = 0; q < n; ++q)
      if (q != r) others.push_back(compute_s[q]);
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    double median = others[others.size() / 2];
    if (others.size() % 2 == 0) {  // the mean of the two middle values
      const double lower = *std::max_element(others.begin(), others.begin() + others.size() / 2);
      median = 0.5 * (median + lower);
    }
    if (compute_s[r] > factor_ * median) {
      ++slow_run_[r];
    } else {
      slow_run_[r] = 0;
      named_[r] = false;
    }
    if (slow_run_[r] >= steps_ && !named_[r] && !found) {
      named_[r] = true;
      found = Straggler{static_cast<int>(r), step - slow_run_[r] + 1, compute_s[r], median};
    }
  }
  return found;
}

}  // namespace anvil::ft
