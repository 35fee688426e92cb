// `anvil launch`: a supervisor that keeps a training job going without a
// person. It runs `anvil train` (under mpirun for more than one rank) with
// per-rank heartbeats, and on a dead rank (the job exits abnormally), a hang
// (no heartbeat progress within the hang timeout), a NaN/Inf loss or
// repeated loss spikes (the trainer's exit statuses 10 and 11) it stops the
// job and restarts it from the newest intact checkpoint, with exponential
// backoff and a restart budget, optionally on fewer ranks (the global batch
// kept). Across hosts (--hosts, --hostfile, Slurm) it builds the mpirun
// line; after a fault it probes every host, names the ones that no longer
// answer and the ranks they held, restarts on the hosts that do (not below
// --min-ranks), and grows back at the next checkpoint once a lost host
// answers again; a host lost twice stays out. Every event goes to a JSONL journal; at the end it reports goodput
// (useful training time / wall time) and the time lost to each cause.
// docs/fault-tolerance.md has the journal's fields.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "anvil/ft/hosts.hpp"

namespace anvil::ft {

struct LaunchOptions {
  int np = 0;                 // ranks; 0: the hosts' slots, or 1 (1 runs anvil train without mpirun)
  std::vector<Host> hosts;    // empty: every rank on this machine
  int min_ranks = 0;          // > 0: elastic; restart on fewer ranks, not below this
  int shrink_by = 1;          // without hosts: ranks a crash takes away
  int probe_port = 22;        // a host answers a TCP connection here (refused counts as up)
  double probe_timeout_s = 3;
  double probe_every_s = 10;  // lost hosts probed this often while the job runs
  std::vector<std::string> mpirun_args;  // extra mpirun arguments (e.g. --mca plm_rsh_agent A)
  bool dry_run = false;                  // print the first attempt's command and stop
  int max_restarts = 5;       // restart budget
  double hang_timeout_s = 60;      // a rank's heartbeat unchanged this long: a hang
  double startup_timeout_s = 300;  // to the first heartbeat of an attempt
  double stop_grace_s = 120;       // interrupted: SIGTERM, then SIGKILL this much later
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
  std::string command;  // the first attempt's command line
};

// The train arguments with the value of `flag` (or its short `alias`)
// replaced, appended when absent.
std::vector<std::string> with_value(std::vector<std::string> args, const std::string& flag,
                                    const std::string& alias, const std::string& value);

// Runs the job to completion or until the restart budget is spent. Throws
// InputError on bad options (no --out among the train arguments, ...).
LaunchResult launch(const LaunchOptions& options);

}  // namespace anvil::ft
