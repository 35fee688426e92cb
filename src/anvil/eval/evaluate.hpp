// `anvil eval`: a checkpoint (dense or ZAYA1) measured two ways
// (docs/eval.md):
//  - perplexity per source: evenly spaced rows of T tokens from the
//    held-out tail of each token file (the tail training validated on);
//  - multiple-choice tasks from local JSONL, one object per line:
//      {"context": "...", "choices": ["...", ...], "gold": 0}
//    each choice scored by the log-likelihood of its tokens after the
//    context (the choice text follows the context directly: put any space
//    in the choices). acc picks the highest log-likelihood; acc_norm the
//    highest per character of the choice, as lm-eval's acc and acc_norm.
// Text goes through the run's tokenizer (bytes or its SentencePiece
// model); a context and a choice are encoded as lm-eval does: the whole
// string, then the context alone, the choice's tokens being the rest.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "anvil/device/runtime.hpp"
#include "anvil/model/config.hpp"

namespace anvil::eval {

struct EvalOptions {
  std::string checkpoint;                                   // step or run directory
  std::vector<std::pair<std::string, std::string>> data;    // name, token file
  std::vector<std::string> tasks;                           // JSONL files
  double val_fraction = 0.05;  // the held-out tail, as anvil train's default
  int64_t rows = 16;           // perplexity rows per source
  int64_t seq = 0;             // 0: the config's seq_len
  int64_t limit = 0;           // questions per task (0: all)
  std::string device = "cpu";  // cpu | cuda (the dense family; docs/gpu.md)
};

struct SourceResult {
  std::string name, path;
  int64_t tokens = 0;
  double loss = 0, perplexity = 0;  // mean nats per token, exp of it
};

struct TaskResult {
  std::string name, path;
  int64_t questions = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
};

struct EvalResult {
  std::string checkpoint, tokenizer;
  std::vector<SourceResult> sources;
  std::vector<TaskResult> tasks;
  nlohmann::json to_json() const;
  std::string text() const;  // tables
};

// Throws InputError naming the file (and line) on bad input.
EvalResult evaluate(const EvalOptions& options);

// The device `anvil eval` and `anvil generate` run a checkpoint's model on:
// `device` parsed ("cpu", "cuda"), then refused before any work when the
// family has no GPU path or no GPU can be used (InputError naming --device);
// on cuda GPU 0 is selected.
device::DeviceKind checkpoint_device(const std::string& device, const model::ModelConfig& config);

}  // namespace anvil::eval
