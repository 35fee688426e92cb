// `anvil train`: the training loop. The Trainer sets up a run from its
// options — the model config, the data, the model on planned memory, the
// distributed optimizer, and the components that own the rest: checkpoints
// (checkpoint_manager.hpp), metrics (metrics_logger.hpp), the fault guard
// and the fault injector (ft/) — then step() runs one optimizer step
// (micro-batches with gradient accumulation, the gradient reduction
// overlapped with the last backward, the global-norm clip, the update) and
// run() loops over steps with validation and checkpoints. Batches are a pure
// function of (seed, step, global row), so a resumed run continues the exact
// trajectory and N data-parallel ranks (mpirun -np N) train on exactly the
// rows one process would.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "anvil/data/batches.hpp"
#include "anvil/ft/guard.hpp"
#include "anvil/ft/straggler.hpp"
#include "anvil/ft/injector.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/precision.hpp"
#include "anvil/model/trainable.hpp"
#include "anvil/parallel/distributed_optimizer.hpp"
#include "anvil/train/checkpoint_manager.hpp"
#include "anvil/train/gemm_peak.hpp"
#include "anvil/train/metrics_logger.hpp"
#include "anvil/train/options.hpp"

namespace anvil::parallel {
class DataParallelGroup;
}  // namespace anvil::parallel

namespace anvil::train {

struct TrainResult {
  std::vector<double> losses;  // per step run in this call
  std::vector<double> step_seconds;
  // Medians over the steps after the first of StepStats' parts, by name
  // (metrics_logger.hpp, step_parts_json).
  nlohmann::json part_seconds = nlohmann::json::object();
  double val_loss = -1;
  // SIGINT or SIGTERM ended the run before its last step, at a step boundary
  // with a checkpoint written: anvil train exits 128 + it (130, 143).
  int stop_signal = 0;
  double tokens_per_second = 0;  // median over the steps after the first
  double mfu = 0;                // at that median
  double flops_per_token = 0;
  double peak_gflops = 0;
  std::string peak_source;  // where peak_gflops comes from
  size_t planned_bytes = 0;
  size_t optimizer_bytes = 0;  // this rank's optimizer state (1/N of it with ZeRO-1)
  bool optimizer_on_device = false;  // the step ran on the model's device (DistributedOptimizer)
  size_t parameter_bytes = 0;  // this rank's weights (its experts only under --ep)
  size_t peak_rss_bytes = 0;
  std::vector<double> rank_peak_rss_bytes;  // every rank's, on rank 0 (data parallel)
  int64_t first_step = 0;
  std::string last_checkpoint;
  int world = 1;                // ranks (data-parallel replicas x context group)
  double comm_seconds = 0;      // median per step: the gradient all-reduce's own time
  double exposed_seconds = 0;   // median per step: the part backward did not hide
  double alltoall_seconds = 0;  // median per step: expert parallelism's dispatch and combine
  double context_seconds = 0;   // median per step: context parallelism's K/V and halo traffic
  double context_halo_seconds = 0;  // of which the halo exchanges
  int cp = 1;                   // ranks per context group
  // --device cuda: what this run took of the GPU's memory (cudaMemGetInfo's
  // free bytes once the GPU is chosen, before the model, less those at the
  // end: the arenas, allocated once, and the libraries' workspaces and NCCL's
  // buffers; not CUDA's context nor other processes'), the device plan it
  // was checked against before allocating, and the GPU's total; 0 on the CPU.
  size_t device_used_bytes = 0, device_planned_bytes = 0, device_total_bytes = 0;
};

// The device memory a --device cuda run plans (its arenas, the device
// optimizer's moments, the earlier micro-batches' gradient sum, the
// cuBLASLt workspace) against what the GPU has free: "" when it fits, else
// the one line the trainer refuses with (exit 2, before allocating).
std::string device_memory_shortfall(size_t planned_bytes, int64_t free_bytes, int gpu);

// SIGINT and SIGTERM, while one is in scope, end a run at its next step
// boundary with a checkpoint (Trainer::run, a recipe between phases) instead
// of killing the process: the signal is recorded, and pending_stop_signal()
// reads it. The outermost scope starts clean; a nested one keeps a signal
// that came before it (between a recipe's phases).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*int_)(int);
  void (*term_)(int);
};
// The signal recorded in a StopSignals scope (0: none).
int pending_stop_signal();

class Trainer {
 public:
  // Set up: checks the options, reads the data, builds the model and the
  // optimizer, prints the plan, initialises or resumes (checkpoint.resume).
  // `dp` is the data-parallel group (null: one process); every rank runs
  // the same options, rank 0 prints and writes metrics.
  Trainer(const TrainOptions& options, parallel::DataParallelGroup* dp);
  ~Trainer();
  // One optimizer step (the next one).
  StepStats step();
  // Validation loss over the held-out rows (-1 without them).
  double validate();
  // A checkpoint of the current step (every rank writes its share; no-op
  // without checkpoint.out); returns once the write has started.
  void save();
  // The whole loop to train.steps (or a stop signal).
  TrainResult run();
  int64_t current_step() const { return step_; }

 private:
  // At a save: the weights every rank holds compared across the ranks.
  void check_replicas(const float* weights) const;
  void build_model();
  // --device cuda: InputError when the plan does not fit the GPU's free memory.
  // Sets result_.device_planned_bytes; InputError when it does not fit.
  void check_device_memory();
  void start(const std::optional<ResumePoint>& from);
  void print_plan() const;
  RunRecord record() const;
  // The step's micro-batches: this rank's summed token losses and scored tokens.
  std::array<double, 2> forward_backward_step();
  // This rank's chunks of full_tokens_/full_targets_ ([B][T]) into
  // tokens_/targets_ ([B][T/cp], context_parallel.hpp's order).
  void take_local_chunks();
  // Tokens per optimizer step over every rank (each counted once).
  double tokens_per_step() const;
  void log(const StepStats& s, double val, double iteration_start);
  double mfu(double tokens_per_second) const;
  void finish_result(const std::vector<StepStats>& steps);
  void print_summary(bool stopped) const;
  bool stop_requested();

  TrainOptions o_;
  parallel::DataParallelGroup* dp_;
  int rank_ = 0, world_ = 1;
  // Context parallelism: cp_ consecutive ranks split each sequence; the
  // data-parallel replicas are world_ / cp_ (this one: dp_rank_).
  int cp_ = 1, dp_rank_ = 0, dp_size_ = 1;
  std::unique_ptr<model::ContextGroup> context_;
  model::ModelConfig config_;
  int64_t B_ = 0, T_ = 0, T_local_ = 0;  // T_local_: T_ / cp_
  model::Precision precision_ = model::Precision::fp32;
  data::Batches batches_;
  std::unique_ptr<model::TrainableModel> model_;
  std::unique_ptr<parallel::DistributedOptimizer> optimizer_;
  ft::Injector injector_;
  ft::FaultGuard guard_;
  ft::StragglerWatch stragglers_;
  int straggler_ = -1;  // --straggler-action exclude: the rank to leave out (every rank knows)
  double last_step_seconds_ = 0;  // this rank's compute in the last step (slow-rank)
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::unique_ptr<MetricsLogger> metrics_;
  GemmPeak peak_;
  std::vector<int32_t> tokens_, targets_, full_tokens_, full_targets_;
  int64_t step_ = 0;
  int64_t saved_step_ = -1;           // the step of the last checkpoint this run wrote (-1: none)
  int64_t device_free_at_start_ = 0;  // --device cuda: free bytes before the model
  TrainResult result_;
};

// Sets up a Trainer and runs it.
TrainResult run_training(const TrainOptions& options, parallel::DataParallelGroup* dp = nullptr);

}  // namespace anvil::train
