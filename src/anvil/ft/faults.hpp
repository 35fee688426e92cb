// Faults for tests and demos, injected into a training job by
// `anvil train --inject KIND@STEP[:RANK][=ARG]` (and `anvil launch`, which
// passes it to the first attempt only), and the errors a trainer raises
// when its own checks see a fault. docs/fault-tolerance.md lists them.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace anvil::ft {

struct Fault {
  std::string kind;  // kill | hang | nan | slow | slow-rank | corrupt-ckpt | kill-in-save | disk-full
  int64_t step = 0;  // the step (from 1) it strikes at (slow: from then on)
  int rank = 0;      // the rank it strikes
  double arg = 0;    // slow: ms added to each step; slow-rank: the factor its compute takes
                     // longer; kill-in-save: ms after the save starts;
                     // disk-full: steps until the space returns (0: it does not)
};

// "kill@30:1", "slow@5=200", "kill-in-save@20:0=3". InputError naming `key`
// and the expected form on anything else.
Fault parse_fault(const std::string& text, const std::string& key = "faults.inject");
std::string fault_kinds();

// Exit statuses of `anvil train` that ask a supervisor to roll back to the
// last checkpoint (anything else non-zero is a crash).
inline constexpr int kExitNonFinite = 10;  // the loss or gradient norm is NaN or Inf
inline constexpr int kExitSpikes = 11;    // repeated loss spikes
inline constexpr int kExitStraggler = 12; // a straggler to leave out (--straggler-action exclude)
inline constexpr int kExitDiverged = 13;  // the data-parallel replicas' weights differ at a save

// Raised by the trainer: the step's loss is not finite, or it spiked too
// often in a row; the CLI exits with `exit_code`.
class TrainingFault : public std::runtime_error {
 public:
  TrainingFault(const std::string& what, int exit_code)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

}  // namespace anvil::ft
