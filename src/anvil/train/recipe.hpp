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

#include "anvil/train/recipe_file.hpp"
#include "anvil/train/trainer.hpp"

namespace anvil::train {

// The phase options: `base` (CLI flags: out_dir, resume, precision, ...)
// with the recipe's config, data, batch, schedule and phase fields.
TrainOptions phase_options(const Recipe& recipe, size_t phase, const TrainOptions& base);

// Runs the phases from where `base.out_dir` stands (base.resume "latest":
// its newest intact checkpoint; else from scratch). Returns the last phase's
// result, with the losses of every phase run in this call.
TrainResult run_recipe(const Recipe& recipe, const TrainOptions& base,
                       parallel::DataParallelGroup* dp = nullptr);

}  // namespace anvil::train
