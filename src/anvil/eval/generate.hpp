// `anvil generate`: sampling from a checkpoint with a KV cache: greedy
// (temperature 0), temperature, and top-k. The prompt is fed one token at a
// time through the same decode path as the sampled tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace anvil::eval {

struct GenerateOptions {
  std::string checkpoint;              // checkpoint dir or run dir (newest step)
  std::string prompt;                  // text (the run's tokenizer: bytes or SentencePiece) ...
  std::vector<int32_t> prompt_tokens;  // ... or token ids
  int64_t max_new = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: all
  uint64_t seed = 1;
  std::string device = "cpu";  // cpu, or cuda (the dense family; the KV cache on the GPU)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new tokens
  std::string text;             // decoded (bytes or SentencePiece); ids otherwise
  std::string tokenizer;        // bytes, sentencepiece, file, random
  double tokens_per_second = 0;
  bool capped = false;  // the context (seq_len) ended generation before max_new
};

// `on_token` (may be empty) gets each new token as it is sampled with the
// text it adds: its bytes, its SentencePiece text, or "ID " without a
// tokenizer. A character split over byte pieces comes whole with its last
// byte's token (the others add ""); a last call with token -1 carries a
// tail that never finished.
GenerateResult generate(const GenerateOptions& options,
                        const std::function<void(int32_t, const std::string&)>& on_token = {});


// Picks the next token from logits [V] (modified in place).
int32_t sample_token(float* logits, int64_t V, double temperature, int64_t top_k, uint64_t seed,
                     uint64_t index);

}  // namespace anvil::eval
