#include "anvil/data/batches.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>

#include "anvil/base/error.hpp"
#include "anvil/base/rng.hpp"

namespace anvil::data {
namespace {

// Global rows of one step are indexed below this; step s draws indices
// [s * kRowsPerStep, (s + 1) * kRowsPerStep).
constexpr uint64_t kRowsPerStep = uint64_t{1} << 32;

}  // namespace

std::vector<Source> parse_sources(const std::string& spec, const std::string& flag) {
  std::vector<Source> out;
  if (spec.empty()) return out;
  if (spec.find(',') == std::string::npos && spec.rfind(':') == std::string::npos) {
    return {{spec, 1.0}};
  }
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t end = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, end - at);
    const size_t colon = item.rfind(':');
    Source s{item, 1.0};
    if (colon != std::string::npos) {
      s.path = item.substr(0, colon);
      try {
        size_t used = 0;
        s.weight = std::stod(item.substr(colon + 1), &used);
        if (used != item.size() - colon - 1) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        throw InputError(flag + ": '" + item + "' (expected PATH:WEIGHT with a number)");
      }
    }
    if (s.path.empty() || !(s.weight > 0) || !(s.weight <= 1e12))  // NaN and inf too
      throw InputError(flag + ": '" + item + "' (expected PATH:WEIGHT with a weight in (0, 1e12])");
    out.push_back(s);
    at = end + 1;
  }
  return out;
}

Batches::Batches(const std::string& path, int64_t vocab, uint64_t seed, int64_t T,
                 double val_fraction)
    : Batches(path.empty() ? std::vector<Source>{} : std::vector<Source>{{path, 1.0}}, vocab, seed,
              T, val_fraction) {}

Batches::Batches(const std::vector<Source>& sources, int64_t vocab, uint64_t seed, int64_t T,
                 double val_fraction)
    : seed_(seed), T_(T), vocab_(vocab) {
  double total = 0;
  for (const auto& src : sources) {
    const std::string& path = src.path;
    data_.push_back(std::make_unique<TokenData>(path));
    const TokenData& d = *data_.back();
    // Every id is below the file's vocabulary (checked when it was opened),
    // so this keeps every input and target inside the model's.
    if (d.vocab_size() > vocab) {
      throw InputError(path + ": vocabulary " + std::to_string(d.vocab_size()) +
                       " exceeds the model's vocab_size " + std::to_string(vocab) +
                       " (expected <= " + std::to_string(vocab) + ")");
    }
    if (!same_tokenizer(d.tokenizer(), d.tokenizer_model(), data_[0]->tokenizer(),
                        data_[0]->tokenizer_model())) {
      throw InputError(path + ": tokenizer " + d.tokenizer() + " " + d.tokenizer_model() +
                       " differs from " + sources[0].path + "'s (expected one tokenizer)");
    }
    const int64_t n = d.size();
    const auto too_few = [&](int64_t count) {
      const auto b = static_cast<int64_t>(static_cast<double>(count) * (1.0 - val_fraction));
      return b < T + 1 || (val_fraction > 0 && count - b < T + 1);
    };
    if (too_few(n)) {
      // The fewest tokens that would do: from just under T / fraction (the
      // validation part, count - floor(count (1 - fraction)), must reach T + 1).
      const double estimate =
          val_fraction > 0 ? std::min(4e18, static_cast<double>(T) / val_fraction) : 0.0;
      int64_t need = std::max(n + 1, static_cast<int64_t>(estimate) - 8);
      while (too_few(need)) ++need;
      throw InputError(path + ": " + std::to_string(n) + " tokens are too few for sequences of " +
                       std::to_string(T) + " with a validation fraction of " +
                       nlohmann::json(val_fraction).dump() + " (expected at least " +
                       std::to_string(need) + " tokens)");
    }
    val_begin_.push_back(static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction)));
    total += src.weight;
    cumulative_.push_back(total);
  }
  for (auto& c : cumulative_) c /= total;
}

bool Batches::has_validation() const {
  for (size_t i = 0; i < data_.size(); ++i)
    if (val_begin_[i] < data_[i]->size()) return true;
  return false;
}

void Batches::train_row(int64_t step, int64_t g, int32_t* tokens, int32_t* targets) const {
  const uint64_t index = static_cast<uint64_t>(step) * kRowsPerStep + static_cast<uint64_t>(g);
  if (data_.empty()) {
    for (int64_t t = 0; t <= T_; ++t) {
      const auto tok = static_cast<int32_t>(random_u64(seed_, index, t) % vocab_);
      if (t < T_) tokens[t] = tok;
      if (t > 0) targets[t - 1] = tok;
    }
    return;
  }
  size_t src = 0;
  if (data_.size() > 1) {  // one source draws no source: its batches are a mixture's of one
    const double u = random_unit(seed_, stream_id("source"), index);
    while (src + 1 < data_.size() && u >= cumulative_[src]) ++src;
  }
  const int64_t span = val_begin_[src] - T_ - 1;
  const int64_t off = static_cast<int64_t>(random_u64(seed_, stream_id("train"), index) %
                                           static_cast<uint64_t>(span + 1));
  data_[src]->copy(tokens, off, T_);
  data_[src]->copy(targets, off + 1, T_);
}

void Batches::train_micro_batch(int64_t step, int64_t micro, int rank, int world, int64_t B,
                                int32_t* tokens, int32_t* targets) const {
  const int64_t first = (micro * world + rank) * B;
  for (int64_t r = 0; r < B; ++r) train_row(step, first + r, tokens + r * T_, targets + r * T_);
}

void Batches::val_row(int64_t i, int64_t count, int32_t* tokens, int32_t* targets) const {
  // Row i from source i mod n, the k-th of that source's rows evenly spaced.
  const auto n = static_cast<int64_t>(data_.size());
  const size_t src = static_cast<size_t>(i % n);
  const int64_t k = i / n, rows = (count - static_cast<int64_t>(src) + n - 1) / n;
  const int64_t span = data_[src]->size() - val_begin_[src] - T_ - 1;
  const int64_t off = val_begin_[src] + (rows > 1 ? span * k / (rows - 1) : 0);
  data_[src]->copy(tokens, off, T_);
  data_[src]->copy(targets, off + 1, T_);
}

}  // namespace anvil::data
