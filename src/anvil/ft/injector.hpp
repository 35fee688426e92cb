// Fault injection at named hooks of a training run (tests and demos): the
// trainer calls each hook at its place in a step or a save, and the one
// fault of `--inject KIND@STEP[:RANK][=ARG]` (faults.hpp) fires there on its
// rank and step. No fault code sits in the training step itself.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "anvil/base/options.hpp"
#include "anvil/ft/faults.hpp"

namespace anvil::ft {

struct InjectOptions {
  std::string inject;
  template <class V>
  void describe(V& v) {
    v({.name = "inject",
       .help =
           "Inject a fault (tests, demos): KIND@STEP[:RANK][=ARG], KIND one of " + fault_kinds() +
           "; e.g. kill@30:1, nan@12, slow@5=200 (ms per step), slow-rank@5:1=3 (rank 1 computes "
           "3x as long), kill-in-save@20=5 (ms into the save), corrupt-ckpt@20 (then dies), "
           "disk-full@20=10 (the checkpoint folder's file system, at most 1 GiB free, full from "
           "the save of step 20 for 10 steps), "
           "flip-param@15:1 (a bit of one weight of rank 1 flips after step 15's update)"},
      inject);
  }
};

class Injector {
 public:
  Injector() = default;
  Injector(const InjectOptions& options, int rank);
  // The hooks. `done` is the number of steps completed when the hook runs.
  // slow: from step STEP on, each step starts ARG ms late. slow-rank: from
  // step STEP on, each step takes ARG times its compute: (ARG - 1) x
  // `last_compute_s` (the previous step's) of sleep is added.
  void step_begin(int64_t done, double last_compute_s = 0) const;
  // nan: step STEP's loss (the sum over its tokens) becomes NaN.
  double step_loss(int64_t done, double loss_sum) const;
  // kill / hang: the process dies or hangs once STEP - 1 steps are done.
  void step_end(int64_t done) const;
  // flip-param: once step STEP's update is done, the top mantissa bit of
  // this rank's first weight flips (silent corruption: training goes on, on
  // weights that differ from the other replicas'). `weights` hands them out
  // for writing; called only when the fault strikes.
  void step_updated(int64_t done, const std::function<float*()>& weights) const;
  // kill-in-save: dies ARG ms into writing the checkpoint of step STEP.
  // disk-full: from the checkpoint of step STEP on, for ARG steps (0: for
  // good), the file system of `run_dir` is full before each save and before
  // its retry: the run directory pruned to its newest intact checkpoint (the
  // room any rank's own prune could free), then RUN_DIR/.disk-full-filler
  // written until ENOSPC; only where at most 1 GiB is free, a small tmpfs,
  // else a warning and nothing. The first save after that removes the
  // filler (the space returns).
  void save_begin(int64_t step, const std::string& run_dir) const;
  // disk-full: the same fill before a save's retry on a full disk.
  void save_retry(int64_t step, const std::string& run_dir) const;
  // Removes a filler that a process which died with the disk full left in
  // `run_dir` (a restart under anvil launch runs without the fault). Called
  // by the trainer before it writes anything there.
  static void clear_stale_fill(const std::string& run_dir);
  // corrupt-ckpt: once the checkpoint of step STEP is committed (`wait`
  // returns), flips one byte of this rank's shard `shard_file` (waiting for
  // the commit's `index_file`) and dies.
  void save_end(int64_t step, const std::function<void()>& wait, const std::string& index_file,
                const std::string& shard_file) const;

 private:
  bool strikes(const char* kind, int64_t step) const;
  void keep_full(int64_t step, const std::string& run_dir) const;
  std::optional<Fault> fault_;
  int rank_ = 0;
};

}  // namespace anvil::ft
