// Training checkpoints: one directory per step under a run directory,
//   <run>/step-00000100/model.safetensors      parameters, Hugging Face names
//   <run>/step-00000100/optimizer.safetensors  <name>.exp_avg, <name>.exp_avg_sq
//                                               (+ <name>.momentum_buffer with Muon)
//   <run>/step-00000100/state.json             step, config, options, data
// A checkpoint is written under a temporary name, fsynced and renamed, so a
// directory named step-* is always complete; older ones beyond `keep` (by
// step number) are removed after the new one is in place.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "anvil/model/params.hpp"
#include "anvil/model/trainable.hpp"

namespace anvil::ckpt {

struct CheckpointData {
  const model::ParamRegistry* registry = nullptr;
  const float* params = nullptr;
  const float* exp_avg = nullptr;  // null: no optimizer state
  const float* exp_avg_sq = nullptr;
  const float* momentum = nullptr;        // Muon's buffers (muon group), or null
  std::vector<model::ExtraTensor> extra;  // buffers outside the registry (ZAYA1's biases)
  std::string state_json;
};

// Writes <run_dir>/step-NNNNNNNN and returns its path. Then removes all but
// the newest `keep` checkpoints by step, never the one just written (after a
// resume from an older step, newer ones of the earlier run stay while they
// are among the newest `keep`).
std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointData& data,
                            int keep);

// "latest" or a run directory -> its newest step-* directory; a step-*
// directory -> itself. Throws InputError when there is none.
std::string resolve_checkpoint(const std::string& path);

std::string read_state_json(const std::string& checkpoint_dir);

// state.json parsed and checked: an anvil-train-state object whose step,
// config, seed, batch, seq and accum have their types. Throws InputError
// naming the file and the problem.
nlohmann::json read_state(const std::string& checkpoint_dir);

// Loads parameters (and optimizer moments when the pointers are non-null)
// into arenas laid out by `registry`; names and shapes must match exactly.
void load_checkpoint(const std::string& checkpoint_dir, const model::ParamRegistry& registry,
                     float* params, float* exp_avg, float* exp_avg_sq, float* momentum = nullptr,
                     const std::vector<model::ExtraTensor>& extra = {});

}  // namespace anvil::ckpt
