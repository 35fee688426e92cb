// Training checkpoints: one directory per step under a run directory
// (<run>/step-00000100), written and read by ckpt/sharded.hpp; here, finding
// them and reading their state.json (step, config, options, data).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "anvil/model/params.hpp"
#include "anvil/model/trainable.hpp"

namespace anvil::ckpt {

// The step-N directories of a run, oldest step first; "step-%08d" of a step.
std::vector<std::string> checkpoint_dirs(const std::string& run_dir);
std::string checkpoint_name(int64_t step);
// Removes one step directory (renamed to .step-N.tmp-deleting first, so a
// crash mid-delete leaves no half step-N behind).
void remove_checkpoint(const std::string& dir);
// Removes all but the newest `keep` step directories (by step), never `newest`.
void prune_checkpoints(const std::string& run_dir, int keep, const std::string& newest);

// "latest" or a run directory -> its newest step-* directory; a step-*
// directory -> itself. Throws InputError when there is none.
std::string resolve_checkpoint(const std::string& path);

std::string read_state_json(const std::string& checkpoint_dir);

// A run trained on SentencePiece ids keeps the model as RUN/tokenizer.model
// (the trainer copies it there); exports copy it along.
inline constexpr const char* kTokenizerFile = "tokenizer.model";
// That file for a checkpoint (in it, or in its run directory); "" if none.
std::string tokenizer_model(const std::string& checkpoint_dir);

// state.json parsed and checked: an anvil-train-state object whose step,
// config, seed, batch, seq and accum have their types. Throws InputError
// naming the file and the problem.
nlohmann::json read_state(const std::string& checkpoint_dir);

}  // namespace anvil::ckpt
