#include "anvil/eval/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "anvil/base/error.hpp"
#include "anvil/base/rng.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/model_tensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/data/tokens.hpp"
#include "anvil/eval/evaluate.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"

namespace anvil::eval {

int32_t sample_token(float* logits, int64_t V, double temperature, int64_t top_k, uint64_t seed,
                     uint64_t index) {
  if (temperature <= 0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double maxv = logits[order[0]];
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[order[i]] - maxv) / temperature);
    sum += p[i];
  }
  double u = random_unit(seed, stream_id("sample"), index) * sum;
  for (int64_t i = 0; i < k; ++i) {
    u -= p[i];
    if (u <= 0) return order[i];
  }
  return order[k - 1];
}

namespace {

// Feeds the prompt one token at a time, then samples until `total` tokens.
void decode_all(model::DecodingModel& model, const std::vector<int32_t>& prompt, int64_t total,
                const GenerateOptions& o, const std::function<void(int32_t)>& on_token, int64_t V,
                GenerateResult& r) {
  model.start_decode(total);
  std::vector<float> logits(static_cast<size_t>(V));
  int64_t pos = 0;
  for (int32_t t : prompt) model.decode_step(t, pos++, logits.data());
  const auto t0 = std::chrono::steady_clock::now();
  while (pos < total) {
    const int32_t next =
        sample_token(logits.data(), V, o.temperature, o.top_k, o.seed, static_cast<uint64_t>(pos));
    r.tokens.push_back(next);
    if (on_token) on_token(next);
    if (pos + 1 < total) model.decode_step(next, pos, logits.data());
    ++pos;
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_second = dt > 0 ? static_cast<double>(r.tokens.size()) / dt : 0;
}

}  // namespace

GenerateResult generate(const GenerateOptions& o,
                        const std::function<void(int32_t, const std::string&)>& on_new) {
  const std::string dir = ckpt::checkpoint_to_read(o.checkpoint, {}, ckpt::model_tensor_problems);
  const auto state = ckpt::read_state(dir);
  const model::ModelConfig config =
      model::parse_model_config(state.at("config").dump(), dir + "/state.json");
  GenerateResult r;
  r.tokenizer = state.value("tokenizer", "random");
  const data::TextCodec text(r.tokenizer, ckpt::tokenizer_model(dir), dir);
  std::vector<int32_t> prompt = o.prompt_tokens;
  if (prompt.empty()) prompt = text.encode(o.prompt, "--prompt");
  if (prompt.empty()) throw InputError("--prompt: expected at least one token");
  for (const int32_t t : prompt)
    if (t < 0 || t >= config.vocab_size)
      throw InputError(std::string(o.prompt_tokens.empty() ? "--prompt" : "--prompt-tokens") +
                       ": " + std::to_string(t) + " is outside the vocabulary [0, " +
                       std::to_string(config.vocab_size) + ")");
  if (o.max_new < 1) throw InputError("--max-new: expected >= 1");
  const int64_t room = config.seq_len - static_cast<int64_t>(prompt.size());  // no overflow
  const int64_t total = static_cast<int64_t>(prompt.size()) + std::min<int64_t>(room, o.max_new);
  if (static_cast<int64_t>(prompt.size()) >= config.seq_len) {
    throw InputError("--prompt: " + std::to_string(prompt.size()) +
                     " tokens leave no room in the context of " + std::to_string(config.seq_len));
  }
  r.capped = o.max_new > room;
  // Each new token's text: the tokens so far decoded, what grew (a
  // SentencePiece piece's leading space depends on its neighbours).
  // A character split over byte-fallback pieces decodes to U+FFFD until its
  // last byte comes: such a tail is held back, so what was shown stays a
  // prefix of the text (the end flushes whatever is left).
  std::vector<int32_t> sampled;
  std::string shown;
  const auto unfinished = [](const std::string& s) {
    static const std::string kReplacement = "\xEF\xBF\xBD";
    return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
  };
  auto on_token = [&](int32_t t) {
    std::string piece;
    if (text.has_text()) {
      sampled.push_back(t);
      const std::string all = text.decode(sampled);
      if (!unfinished(all)) {
        piece = all.substr(std::min(shown.size(), all.size()));
        shown = all;
      }
    } else {
      piece = std::to_string(t) + " ";
    }
    r.text += piece;
    if (on_new) on_new(t, piece);
  };
  const auto model =
      model::model_family(config).make_decoding_model(config, checkpoint_device(o.device, config));
  model::TrainableModel& weights = model->weights();
  ckpt::load_weights(dir, weights.registry(), weights.params(), weights.extra_state());
  decode_all(*model, prompt, total, o, on_token, config.vocab_size, r);
  if (text.has_text() && !sampled.empty()) {
    const std::string all = text.decode(sampled);
    if (all.size() > shown.size()) {  // a held-back tail that never finished
      const std::string piece = all.substr(shown.size());
      r.text += piece;
      if (on_new) on_new(-1, piece);
    }
  }
  return r;
}

}  // namespace anvil::eval
