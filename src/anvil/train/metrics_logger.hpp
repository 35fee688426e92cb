// What a training run reports as it goes: a record per step in
// RUN/metrics.jsonl (truncated to the trajectory a resumed run continues),
// the same scalars as TensorBoard event files, and the progress line on
// stdout (rewritten in place on a terminal, every log_every steps
// otherwise). Rank 0 reports; the other ranks only contribute their numbers.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/files.hpp"
#include "anvil/base/step_parts.hpp"
#include "anvil/train/options.hpp"
#include "anvil/train/tensorboard.hpp"

namespace anvil::train {

// One optimizer step's results, the same on every rank.
struct StepStats {
  int64_t step = 0;  // from 1
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  double comm_seconds = 0, exposed_seconds = 0;  // data parallel; 0 on one process
  double alltoall_seconds = 0;                   // expert parallel; 0 without
  double context_seconds = 0;  // context parallel: K/V gathers, dK/dV reduce-scatters, halos
  double context_halo_seconds = 0;  // of which the CCA halo exchanges
  double save_wait_seconds = 0;  // the optimizer update waited for a background save
  bool skipped = false;          // a loss spike: the update was not applied
  // Where the step's time went (base/step_parts.hpp): forward and backward
  // over every micro-batch, the GEMMs, attention and experts inside them
  // (the rest: norms, activations, losses, zeroing), then the gradient norm
  // and the optimizer update.
  double forward_backward_seconds = 0;
  StepPartSeconds parts{};
  double optimizer_seconds = 0;
};

// The step-part record of s: {"gemm", "attention", "experts", "other",
// "optimizer"} in seconds ("other": forward and backward less the three).
nlohmann::json step_parts_json(const StepStats& s);

// What a step's record holds beyond StepStats.
struct StepReport {
  double val_loss = -1;        // -1: not validated at this step
  double tokens_per_step = 0;  // over every rank
  double mfu = 0;
  double iteration_seconds = 0;  // the step with its loop's stop vote, validation and logging
  nlohmann::json model_metrics;                           // the model's own (router loads ...)
  std::string model_note;                                 // its progress-line fragment
  std::vector<double> rank_rss, rank_comm, rank_exposed;  // data parallel
  std::vector<double> rank_compute, rank_wait;  // step time less waits in collectives; the waits
};

// The scalars of a metrics record as TensorBoard tags (train/, perf/, val/,
// and per ZAYA1 MoE layer router/layerN/...).
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record);

// Keeps the lines of metrics.jsonl at `path` up to step `start` (the whole
// previous file stays as path.N); nothing when no line is past it.
void truncate_metrics(const std::string& path, int64_t start);

class MetricsLogger {
 public:
  // `out_dir` "" : no metrics file. `rank`/`world`: the data-parallel group;
  // `tty`: stdout is a terminal (progress rewritten in place).
  MetricsLogger(const MetricsOptions& options, const PhaseOptions& phase, std::string out_dir,
                int rank, int world, int ep, bool tty);
  // Opens the outputs for a run that continues from step `start` of `steps`.
  void open(int64_t start, int64_t steps);
  bool wants_rank_numbers() const { return world_ > 1 && !out_dir_.empty(); }
  void log(const StepStats& s, const StepReport& r);

 private:
  nlohmann::json record(const StepStats& s, const StepReport& r) const;
  std::string progress_line(const StepStats& s, const StepReport& r) const;

  MetricsOptions o_;
  PhaseOptions phase_;
  std::string out_dir_;
  int rank_, world_, ep_;
  bool tty_;
  int64_t start_ = 0, steps_ = 0;
  std::unique_ptr<AppendFile> file_;
  int64_t lines_lost_ = 0;   // lines a full disk refused
  int64_t events_lost_ = 0;  // TensorBoard events the same
  std::unique_ptr<EventWriter> events_;
};

}  // namespace anvil::train
