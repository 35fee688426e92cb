// `anvil train`: the training loop. A Trainer reads tokens (token file or
// raw text), builds the model and its optimizers on planned memory, prints
// the memory plan and starts fresh or from a checkpoint (setup); step() runs
// one optimizer step: micro-batches with gradient accumulation, the
// data-parallel gradient reduction overlapped with the last backward,
// global-norm clipping, the learning-rate schedule; run() loops over steps
// with a live progress line, a JSONL metrics log, periodic validation and
// checkpoints. Batches are a pure function of (seed, step, global row), so a
// resumed run continues the exact trajectory, and N data-parallel ranks
// (mpirun -np N) train on exactly the rows one process would.
#pragma once

#include <cstdint>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "anvil/data/batches.hpp"
#include "anvil/ft/faults.hpp"

#include "anvil/model/family.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/muon.hpp"
#include "anvil/train/tensorboard.hpp"

namespace anvil::parallel {
class DataParallelGroup;
class GradReducer;
}  // namespace anvil::parallel

namespace anvil::train {

struct TrainOptions {
  std::string config;                  // path to a model config JSON
  std::vector<std::string> overrides;  // --set key=value
  // Token file or text, or a mixture "A.tok:0.7,B.tok:0.3"; empty: random
  // tokens (benchmarks).
  std::string data;
  int64_t batch = 4;  // rows per micro-batch on each rank; global = batch x accum x ranks
  int64_t seq = 0;    // 0: the config's seq_len
  int64_t accum = 1;
  int64_t steps = 100;
  optim::Schedule schedule;
  optim::AdamWConfig adamw;
  std::string optimizer = "adamw";  // adamw | muon (block matrices; AdamW for the rest)
  optim::MuonConfig muon;
  double clip = 1.0;  // 0: off
  uint64_t seed = 1234;
  double val_fraction = 0.05;
  int64_t val_every = 0;  // steps; 0: only at the end
  int64_t val_batches = 8;
  std::string out_dir;     // checkpoints and metrics; empty: none written
  int64_t ckpt_every = 0;  // 0: only at the end (when out_dir is set)
  int keep = 3;
  std::string resume;  // checkpoint dir, run dir or "latest" (= out_dir)
  // With resume: accept an accum other than the checkpoint's (a global-batch
  // ramp). Weights, optimizer state and step carry over; the data draws
  // follow the new accum, so it is not the checkpoint's exact trajectory.
  bool resume_new_accum = false;
  // With resume: the checkpoint ends an earlier recipe phase; this one may
  // change the batch, accum, sequence length, data and the config's
  // rope_theta / seq_len (weights, optimizer state and step carry over).
  bool resume_new_phase = false;
  std::string phase;  // a recipe phase's name (metrics, state.json); empty otherwise
  // Where the phase starts: its first step and the tokens trained before it
  // (the metrics' running token count).
  int64_t phase_first_step = 0;
  int64_t tokens_before_phase = 0;
  int64_t log_every = 10;  // lines when stdout is not a terminal
  double peak_gflops = 0;  // 0: measure a 2048^3 GEMM (in --precision) at start
  // ZAYA1 expert-bias balancing and router losses; defaults in model::Balancing.
  model::Balancing balancing;
  std::string precision = "fp32";  // fp32 | bf16 (bf16 GEMM inputs, fp32 master weights)
  bool quiet = false;
  // Data parallel (under mpirun): gradient bucket size in MiB of fp32.
  double bucket_mib = 4.0;
  // ZeRO-1: each rank keeps the AdamW state of, and updates, only its block
  // of every gradient bucket; the updated weights are all-gathered. (Muon's
  // momentum is always split by matrix over the ranks.)
  bool zero = false;
  // Expert parallelism (ZAYA1): groups of `ep` consecutive ranks share the
  // experts, E / ep each, with all-to-all token dispatch.
  int ep = 1;
  // Checkpoints written by a background thread while the next step's
  // forward and backward run (they only read the weights and the optimizer
  // state); that step's optimizer update waits for the write to finish.
  // false: written before save() returns.
  bool async_save = true;
  // Fault tolerance (docs/fault-tolerance.md). heartbeat_dir: each rank
  // writes DIR/rank-R ("STEP UNIX_TIME LOSS") after every step for a
  // supervisor. A loss more than spike_z standard deviations above the
  // mean of the last spike_window losses skips its update; max_spikes in a
  // row end the run with ft::kExitSpikes (roll back); a NaN/Inf loss or
  // gradient norm ends it with ft::kExitNonFinite. spike_z 0: no check.
  std::string heartbeat_dir;
  double spike_z = 6.0;
  int spike_window = 20;
  int max_spikes = 3;
  std::optional<ft::Fault> inject;  // --inject (tests and demos)
  // TensorBoard event files of the scalars in metrics.jsonl (rank 0).
  std::string tensorboard_dir;
};

struct TrainResult {
  std::vector<double> losses;  // per step run in this call
  std::vector<double> step_seconds;
  double val_loss = -1;
  double tokens_per_second = 0;  // median over the steps after the first
  double mfu = 0;                // at that median
  double flops_per_token = 0;
  double peak_gflops = 0;
  size_t planned_bytes = 0;
  size_t optimizer_bytes = 0;  // this rank's optimizer state (1/N of it with ZeRO-1)
  size_t parameter_bytes = 0;  // this rank's weights (its experts only under --ep)
  size_t peak_rss_bytes = 0;
  std::vector<double> rank_peak_rss_bytes;  // every rank's, on rank 0 (data parallel)
  int64_t first_step = 0;
  std::string last_checkpoint;
  int world = 1;                // data-parallel ranks
  double comm_seconds = 0;      // median per step: the gradient all-reduce's own time
  double exposed_seconds = 0;   // median per step: the part backward did not hide
  double alltoall_seconds = 0;  // median per step: expert parallelism's dispatch and combine
};

// One optimizer step's results, the same on every rank.
struct StepStats {
  int64_t step = 0;  // from 1
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  double comm_seconds = 0, exposed_seconds = 0;  // data parallel; 0 on one process
  double alltoall_seconds = 0;                   // expert parallel; 0 without
  double save_wait_seconds = 0;  // the optimizer update waited for a background save
  bool skipped = false;          // a loss spike: the update was not applied
};

class Trainer {
 public:
  // Set up: checks the options, reads the data, builds the model and the
  // optimizers, prints the plan, initialises or resumes (options.resume).
  Trainer(const TrainOptions& options, parallel::DataParallelGroup* dp);
  ~Trainer();
  // One optimizer step (the next one).
  StepStats step();
  // Validation loss over the held-out rows (-1 without them).
  double validate();
  // A checkpoint of the current step (every rank writes its share; no-op
  // without out_dir). With async_save it returns once the write has started.
  void save();
  // Waits for a background save to finish (rethrowing its error); returns
  // the seconds waited.
  double wait_for_save();
  // The whole loop to options.steps (or a stop signal).
  TrainResult run();
  int64_t current_step() const { return step_; }

 private:
  void resume(const std::string& from);
  std::string state_json() const;
  void log(const StepStats& s, double val);
  bool stop_requested();
  double distributed_norm();
  void broadcast_muon_matrices(float* data);

  TrainOptions o_;
  parallel::DataParallelGroup* dp_;
  int rank_ = 0, world_ = 1;
  model::ModelConfig config_;
  int64_t B_ = 0, T_ = 0;
  model::Precision precision_ = model::Precision::fp32;
  data::Batches batches_;
  std::unique_ptr<model::TrainableModel> model_;
  std::unique_ptr<optim::AdamW> adamw_;
  std::unique_ptr<optim::Muon> muon_;
  std::unique_ptr<parallel::GradReducer> reducer_;
  std::unique_ptr<std::ofstream> metrics_;
  std::unique_ptr<EventWriter> events_;
  std::vector<int32_t> tokens_, targets_;
  int64_t step_ = 0;
  bool tty_ = false;
  TrainResult result_;
  std::string nonce_;  // this job's, the same on every rank (checkpoint temporaries)
  std::vector<double> recent_losses_;  // the spike check's window
  int spikes_in_a_row_ = 0;
  void heartbeat(double loss);
  bool is_spike(double loss);            // updates the window; throws after max_spikes in a row
  bool strikes(const char* kind) const;  // the injected fault is `kind`, for this rank now
  std::thread saver_;
  std::exception_ptr save_error_;
};

// `dp` is the data-parallel group (null: one process). On a group, every rank
// runs the same options; rank 0 prints, writes metrics and checkpoints.
TrainResult run_training(const TrainOptions& options, parallel::DataParallelGroup* dp = nullptr);

}  // namespace anvil::train
