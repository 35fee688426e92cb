#include "anvil/comm/transport.hpp"

namespace anvil::comm {

void Transport::fail_timeout(const std::string& what, int step,
                             const std::vector<int>& missing) const {
  std::string ranks;
  for (int m : missing) {
    if (m >= 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(m);
  }
  throw CommTimeout("rank " + std::to_string(rank_) + ": " + what + " timed out after " +
                    std::to_string(static_cast<int>(timeout())) + " s at step " +
                    std::to_string(step) + "; " +
                    (ranks.empty() ? std::string("some rank (a barrier does not say which)")
                                   : "rank(s) " + ranks) +
                    " did not arrive");
}

}  // namespace anvil::comm
