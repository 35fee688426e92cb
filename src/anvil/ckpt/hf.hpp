// Hugging Face interop (docs/interop.md): `anvil ckpt export` writes an
// anvil checkpoint as a directory transformers' from_pretrained loads, and
// `anvil ckpt import --hf` reads such a directory back into an anvil
// checkpoint that `anvil train --resume` and `anvil generate` use.
//
// What goes where is the config family's adapter's (hf_adapter.hpp):
// ZAYA1 -> ZayaForCausalLM (transformers' native layout: one decoder layer
// per block, experts stacked), GPT-2-style dense configs ->
// GPT2LMHeadModel, Llama-style -> LlamaForCausalLM; `--format original`
// writes ZAYA1's alternating-layer layout (docs/zaya1-spec.md section 7), which
// Zyphra's converter takes. Each architecture's config keys and tensor map
// are one table read both ways, so export and import cannot drift apart.
#pragma once

#include <cstdint>
#include <string>

namespace anvil::ckpt {

struct ExportOptions {
  std::string checkpoint;         // a step-* directory or a run directory
  std::string out_dir;            // new directory
  std::string format = "hf";      // hf (transformers' native) | original (ZAYA1 alternating)
  std::string dtype = "float32";  // float32 | bfloat16 (round to nearest even)
  int64_t max_shard_bytes = 5'000'000'000;  // above: model-0000k-of-0000n + index.json
};

struct ExportResult {
  std::string out_dir;
  std::string architecture;  // ZayaForCausalLM, GPT2LMHeadModel, LlamaForCausalLM
  int64_t tensors = 0;
  int64_t parameters = 0;
  int64_t files = 0;  // safetensors files written
};

// Throws InputError for a checkpoint no transformers architecture expresses
// exactly (a ZAYA1 model whose skip class outputs gate * x, a dense config
// that is neither GPT-2 nor Llama shaped), an existing `out_dir` or bad
// options. The directory appears whole or not at all.
ExportResult export_checkpoint(const ExportOptions& options);

struct ImportResult {
  std::string checkpoint_dir;  // RUN/step-00000000
  std::string config_path;     // RUN/model-config.json (for anvil train --config)
  std::string architecture;
  int64_t tensors = 0;
  int64_t parameters = 0;
  std::string note;  // what the import chose that the files do not say (or empty)
};

// Reads HF_DIR (config.json and model.safetensors, or a sharded index) of a
// ZayaForCausalLM, GPT2LMHeadModel or LlamaForCausalLM and writes RUN (new
// or empty) with a weights-only checkpoint at step 0. Throws InputError
// naming the file and tensor on a missing, unexpected or misshapen tensor.
ImportResult import_hf(const std::string& hf_dir, const std::string& run_dir);

}  // namespace anvil::ckpt
