// A training recipe file (docs/recipe.md) read, checked and planned: its
// phases with their token budgets, mixtures, schedules, batches, sequence
// lengths and context-parallel degrees. Apart from running it (recipe.hpp)
// so that the reader alone can be tested and fuzzed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/optim/adamw.hpp"

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
  int64_t trained_tokens = 0;  // steps x tokens per step: the budget rounded up to whole steps
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

}  // namespace anvil::train
