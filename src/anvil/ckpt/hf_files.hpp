// transformers' checkpoint files: the weights as model.safetensors, or as
// model-0000k-of-0000n.safetensors shards with model.safetensors.index.json
// naming each tensor's file, as from_pretrained and save_pretrained use them;
// and the export directory written whole or not at all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "anvil/ckpt/safetensors.hpp"

namespace anvil::ckpt {

// One tensor to write; its values come from write_hf_weights' fill.
struct HfOutTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t bytes(bool bf16) const;
};

// Writes `tensors` in order into files of at most `max_bytes` (a larger
// tensor gets a file alone), with an index when there is more than one, as
// F32 or (`bf16`) BF16. fill(tensor, at, dst, n) writes bytes [at, at + n)
// of tensors[tensor] in that dtype, asked for in order: the values are made
// as the files are written, not held. Returns the file count.
int64_t write_hf_weights(
    const std::filesystem::path& dir, const std::vector<HfOutTensor>& tensors, int64_t max_bytes,
    bool bf16, const std::function<void(size_t tensor, uint64_t at, char* dst, size_t n)>& fill);

// The tensors of a transformers checkpoint directory (one file or an
// index), opened for reading one at a time: every file's header is read
// and checked at open, a tensor's values when it is read. InputError naming
// the index when it is malformed, or a tensor two files hold.
class HfWeights {
 public:
  explicit HfWeights(const std::filesystem::path& dir);
  // Every tensor's shape, by name.
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  // One tensor's values as floats (BF16 widened).
  LoadedTensor read(const std::string& name) const;

 private:
  std::vector<SafetensorsReader> files_;
  std::map<std::string, size_t> file_of_;  // tensor -> index in files_
  std::map<std::string, std::vector<int64_t>> shapes_;
};

// Creates `target`'s temporary sibling, `fill` writes into it, then fsync
// and rename: `target` appears whole or not at all (nothing is left on an
// exception).
void write_directory(const std::filesystem::path& target,
                     const std::function<void(const std::filesystem::path&)>& fill);

}  // namespace anvil::ckpt
