// `anvil train`: the training loop. Reads tokens (token file or raw text),
// builds the decoder and AdamW on planned memory, prints the memory plan,
// then steps: micro-batches with gradient accumulation, global-norm clipping,
// the learning-rate schedule, a live progress line and a JSONL metrics log,
// periodic validation and checkpoints. Batches are a pure function of
// (seed, step), so a resumed run continues the exact trajectory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model/zaya_model.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/muon.hpp"

namespace anvil::train {

struct TrainOptions {
  std::string config;                  // path to a model config JSON
  std::vector<std::string> overrides;  // --set key=value
  std::string data;                    // token file or text; empty: random tokens (benchmarks)
  int64_t batch = 4;
  int64_t seq = 0;  // 0: the config's seq_len
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
  int64_t log_every = 10;  // lines when stdout is not a terminal
  double peak_gflops = 0;  // 0: measure a 2048^3 GEMM (in --precision) at start
  // ZAYA1 expert-bias balancing and router losses; defaults in model::Balancing.
  model::Balancing balancing;
  std::string precision = "fp32";  // fp32 | bf16 (bf16 GEMM inputs, fp32 master weights)
  bool quiet = false;
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
  size_t peak_rss_bytes = 0;
  int64_t first_step = 0;
  std::string last_checkpoint;
};

TrainResult run_training(const TrainOptions& options);

}  // namespace anvil::train
