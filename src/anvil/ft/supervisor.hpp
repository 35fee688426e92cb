// `anvil launch`: a supervisor that keeps a training job going without a
// person. It runs `anvil train` (under mpirun for more than one rank) with
// per-rank heartbeats, and on a dead rank (the job exits abnormally), a hang
// (no heartbeat progress within the hang timeout), a NaN/Inf loss or
// repeated loss spikes (the trainer's exit statuses 10 and 11) it stops the
// job and restarts it from the newest intact checkpoint, with exponential
// backoff and a restart budget, optionally on fewer ranks (the global batch
// kept). Every event goes to a JSONL journal; at the end it reports goodput
// (useful training time / wall time) and the time lost to each cause.
// docs/fault-tolerance.md has the journal's fields.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace anvil::ft {

struct LaunchOptions {
  int np = 1;                 // ranks; 1 runs anvil train without mpirun
  int min_np = 0;             // > 0: after a crash, restart on np - shrink_by ranks, not below this
  int shrink_by = 1;          // ranks a lost "node" takes with it
  int max_restarts = 5;       // restart budget
  double hang_timeout_s = 60;      // a rank's heartbeat unchanged this long: a hang
  double startup_timeout_s = 300;  // to the first heartbeat of an attempt
  double backoff_s = 1;            // before restart k: backoff x 2^(k-1), at most 60 s
  std::string journal;             // default: <out>/journal.jsonl
  std::string inject;              // --inject for the first attempt only
  std::vector<std::string> train_args;  // anvil train's arguments (must include --out)
  bool quiet = false;
};

struct LaunchResult {
  int exit_code = 0;  // 0: the job finished
  int attempts = 0;
  double wall_s = 0, useful_s = 0, goodput = 0;
  std::map<std::string, double> lost_s;  // by cause: detection + restart + recomputed steps
  std::string journal;
};

// Runs the job to completion or until the restart budget is spent. Throws
// InputError on bad options (no --out among the train arguments, ...).
LaunchResult launch(const LaunchOptions& options);

}  // namespace anvil::ft
