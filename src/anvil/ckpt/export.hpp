// `anvil ckpt export --hf`: a ZAYA1 checkpoint as a Hugging Face style
// directory: model.safetensors with the weights under their original-layout
// names (../shared/ZAYA1.md section 7; anvil's checkpoints already use them,
// balancing biases included, optimizer state left out) and config.json with
// the transformers ZayaConfig keys. The directory appears whole or not at
// all (written under a temporary name, fsynced, renamed).
#pragma once

#include <string>

namespace anvil::ckpt {

struct ExportResult {
  std::string out_dir;
  int64_t tensors = 0;
  int64_t parameters = 0;
};

// `checkpoint`: a step-* directory, a run directory or "latest"-style path
// (resolve_checkpoint). Throws InputError for a non-ZAYA1 checkpoint or an
// existing `out_dir`.
ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir);

}  // namespace anvil::ckpt
