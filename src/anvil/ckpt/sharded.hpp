// Sharded checkpoints (docs/checkpoints.md has the format). A step directory
//   <run>/step-00000100/index.json              every global tensor: dtype, shape,
//                                               kind (model | optimizer), its shards
//                                               (file, rank, flat offset and length in
//                                               the tensor, byte range in the file,
//                                               CRC-32); the layout that wrote it; the
//                                               train state
//   <run>/step-00000100/state.json              the train state alone
//   <run>/step-00000100/rank-00003.safetensors  rank 3's pieces, each a flat F32 tensor
//                                               named <key>@<offset>
// Every rank writes its own pieces (model::TensorShard lists: which rank
// writes what is the caller's choice; each element of each tensor exactly
// once). The commit: all ranks write into .step-N.tmp-<job>, rank 0 merges
// their part lists into index.json, written last, fsyncs and renames the
// directory, so a step-N directory is complete or absent.
// Loading fills any list of pieces from whatever layout wrote the
// checkpoint (reshaping), reading only the byte ranges it needs plus the
// rest of each shard it touches for the checksum, in bounded chunks (no
// whole-file copies). Version 1 checkpoints (one model.safetensors and one
// optimizer.safetensors) load through the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/model/params.hpp"
#include "anvil/model/trainable.hpp"

namespace anvil::ckpt {

// A checkpoint that is there but damaged: a missing or short file, a
// checksum that does not match, an index that does not cover a tensor.
class CorruptCheckpoint : public InputError {
 public:
  using InputError::InputError;
};

// The ranks that save one checkpoint together. No collective is used (a
// save may run on a background thread while training goes on): each rank
// writes its part into .step-N.tmp-<nonce>, and rank 0 commits once every
// part is there (within timeout_s).
struct SaveGroup {
  int rank = 0, world = 1;
  std::string nonce = "0";  // the same on every rank of one job, new per job
  double timeout_s = 600;
  std::function<void()> before_retry;  // run before the retry on a full disk (fault injection)
};

struct ShardedSave {
  std::vector<model::TensorShard> model;      // the pieces this rank writes
  std::vector<model::TensorShard> optimizer;  // (replica 0 only; others are skipped)
  std::string state_json;                     // the train state (rank 0's is kept)
  nlohmann::json layout = nlohmann::json::object();  // world, zero, ep, optimizer, ...
  // When set, the pieces' bytes are made as the file is written rather than
  // read from their `data`: fill(piece, at, dst, n) writes bytes [at, at + n)
  // of piece `piece` (counted over model, then optimizer), whole floats, in
  // order (and again from the start when a full disk makes the save retry).
  std::function<void(size_t piece, uint64_t at, char* dst, size_t n)> fill;
};

// Writes <run_dir>/step-NNNNNNNN (every rank of `group` calls it) and
// returns its path; on rank 0 it returns once the step is committed (the
// others return after writing their part). Rank 0 then removes all but the
// newest `keep` step directories, never the one just written, and the
// temporary directories of crashed jobs.
// A save that fails leaves nothing behind: a rank that cannot write its
// part removes it and leaves RANK.failed, and rank 0 then removes the whole
// temporary folder. On a full disk (ENOSPC) a rank first prunes the run
// directory down to its newest intact checkpoint and tries once more
// (`note`, when given, says so).
std::string save_sharded(const std::string& run_dir, int64_t step, const ShardedSave& save,
                         const SaveGroup& group, int keep, std::string* note = nullptr);

// Removes every step directory of `run_dir` but the newest one that
// verifies (damaged newer ones too); none when none is intact.
void prune_to_newest_intact(const std::string& run_dir);

// The file rank R writes its pieces to: "rank-0000R.safetensors".
std::string shard_file(int rank);

// Rewrites checkpoint `from` (a step or run directory, any layout) as
// RUN/step-N written by `world` ranks, each holding 1/world of the bytes;
// the tensors come out identical. Returns the new directory.
std::string reshape_checkpoint(const std::string& from, const std::string& run_dir, int world);

// Fills every piece of `want` (key, offset, numel, data) from the checkpoint
// in `dir`, sharded or version 1. Each shard it reads from is checked
// against its CRC-32. Throws CorruptCheckpoint naming the file and tensor
// on damage, InputError when a wanted tensor is absent or of another shape.
void load_pieces(const std::string& dir, const std::vector<model::TensorShard>& want);

// load_pieces for a reader that loads many times (an export, tensor by
// tensor): the index is parsed and the shard files checked once, at open.
class PieceReader {
 public:
  explicit PieceReader(const std::string& dir);
  void load(const std::vector<model::TensorShard>& want) const;

 private:
  std::string dir_;
  nlohmann::json index_;  // null: a version-1 checkpoint
};

// The model's weights (registry order) and its extra model state (not the
// optimizer's) from a checkpoint: generation, evaluation.
void load_weights(const std::string& dir, const model::ParamRegistry& registry, float* params,
                  const std::vector<model::ExtraTensor>& extra = {});

// The checkpoint's tensors of one kind ("model" or "optimizer") as whole
// tensors, by name (exports, generation, tests); with `only`, just those
// names (the others are not read).
std::map<std::string, LoadedTensor> read_tensors(const std::string& dir,
                                                 const std::string& kind = "model",
                                                 const std::set<std::string>* only = nullptr);
// Their shapes, by name, without reading the data.
std::map<std::string, std::vector<int64_t>> tensor_shapes(const std::string& dir,
                                                          const std::string& kind = "model");

struct VerifyReport {
  std::string dir;
  int version = 0;
  int64_t tensors = 0, shards = 0, bytes = 0;
  std::vector<std::string> problems;  // empty: intact
  nlohmann::json layout;
};
// Problems of a checkpoint's tensors beyond its files (given its state.json
// and index.json): ckpt/model_tensors.hpp's model_tensor_problems checks
// them against the model of the recorded config.
using TensorCheck = std::function<std::vector<std::string>(
    const std::string& dir, const nlohmann::json& state, const nlohmann::json& index)>;

// Every shard's bytes against its checksum, every tensor covered exactly
// once, every file present, and `tensors` where given; never throws on
// damage (it is reported).
VerifyReport verify_checkpoint(const std::string& dir, const TensorCheck& tensors = {});

// The checkpoint a reader of `path` (eval, generate, export) takes: `path`
// itself when it is a checkpoint (damage there is named as it loads), else
// the newest intact one of the run directory, as a resume takes it, each
// damaged newer one named through `warn` (an "anvil: warning:" line on
// stderr when empty).
std::string checkpoint_to_read(const std::string& path,
                               const std::function<void(const std::string&)>& warn = {},
                               const TensorCheck& tensors = {});

// The newest intact checkpoint of a run directory (verify_checkpoint
// decides; each damaged newer one is reported through `warn`), or `path`
// itself when it is a checkpoint (CorruptCheckpoint when damaged). Throws
// InputError when there is none intact.
std::string newest_intact_checkpoint(const std::string& path,
                                     const std::function<void(const std::string&)>& warn,
                                     const TensorCheck& tensors = {});

}  // namespace anvil::ckpt
