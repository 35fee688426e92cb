// Training recipes (docs/recipe.md): a run in phases, as the paper trains
// ZAYA1 (pretraining, annealing, context extension). Each phase has a token
// budget, a data mixture (weights per named source), a learning-rate
// schedule of its own (WSD by default: warmup, stable, decay), a batch
// (rows and accumulation: a batch-size ramp over phases), a sequence length,
// a RoPE theta and a context-parallel degree (context extension). `anvil
// train --recipe FILE --out RUN` runs the phases in order, each continuing
// the previous one's weights and optimizer state; `--resume latest` picks up
// mid-phase on the exact trajectory, or at the next phase's start.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/train/trainer.hpp"

namespace anvil::train {

struct Phase {
  std::string name;
  int64_t tokens = 0;                     // budget; steps = ceil(tokens / tokens per step)
  int64_t seq = 0;                        // T (0: the config's seq_len)
  int64_t batch = 0;                      // rows per micro-batch per rank
  int64_t accum = 1;                      // micro-batches per step
  double rope_theta = 0;                  // 0: the config's
  int64_t cp = 1;                         // context-parallel ranks (divides the world)
  std::map<std::string, double> mixture;  // source name -> weight
  optim::Schedule schedule;               // start / total are filled in by the plan
  // The plan: global steps [first_step, first_step + steps).
  int64_t first_step = 0, steps = 0, tokens_before = 0;
};

struct Recipe {
  std::string path, name;
  std::string config;                          // model config JSON
  std::vector<std::string> set;                // config overrides
  model::ModelConfig model;                    // the config with them
  std::map<std::string, std::string> sources;  // name -> token file
  uint64_t seed = 1234;
  std::string optimizer = "adamw";
  int64_t ckpt_every = 0, val_every = 0;
  std::vector<Phase> phases;
};

// Reads and checks a recipe (InputError naming the file and key) and plans
// its phases for `world` data-parallel ranks.
Recipe load_recipe(const std::string& path, int world = 1);

// The phase options: `base` (CLI flags: out_dir, resume, precision, ...)
// with the recipe's config, data, batch, schedule and phase fields.
TrainOptions phase_options(const Recipe& recipe, size_t phase, const TrainOptions& base);

// Runs the phases from where `base.out_dir` stands (base.resume "latest":
// its newest intact checkpoint; else from scratch). Returns the last phase's
// result, with the losses of every phase run in this call.
TrainResult run_recipe(const Recipe& recipe, const TrainOptions& base,
                       parallel::DataParallelGroup* dp = nullptr);

}  // namespace anvil::train
