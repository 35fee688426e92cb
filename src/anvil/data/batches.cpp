#include "anvil/data/batches.hpp"

#include "anvil/base/error.hpp"
#include "anvil/base/rng.hpp"

namespace anvil::data {
namespace {

// Global rows of one step are indexed below this; step s draws indices
// [s * kRowsPerStep, (s + 1) * kRowsPerStep).
constexpr uint64_t kRowsPerStep = uint64_t{1} << 32;

}  // namespace

Batches::Batches(const std::string& path, int64_t vocab, uint64_t seed, int64_t T,
                 double val_fraction)
    : seed_(seed), T_(T), vocab_(vocab) {
  if (path.empty()) return;
  data_ = std::make_unique<TokenData>(path);
  // Every id is below the file's vocabulary (checked when it was opened),
  // so this keeps every input and target inside the model's.
  if (data_->vocab_size() > vocab) {
    throw InputError(path + ": vocabulary " + std::to_string(data_->vocab_size()) +
                     " exceeds the model's vocab_size " + std::to_string(vocab) +
                     " (expected <= " + std::to_string(vocab) + ")");
  }
  const int64_t n = data_->size();
  val_begin_ = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));
  if (val_begin_ < T + 1 || (val_fraction > 0 && n - val_begin_ < T + 1)) {
    throw InputError(path + ": " + std::to_string(n) + " tokens are too few for sequences of " +
                     std::to_string(T) + " with a validation fraction of " +
                     std::to_string(val_fraction));
  }
}

void Batches::train_row(int64_t step, int64_t g, int32_t* tokens, int32_t* targets) const {
  const uint64_t index = static_cast<uint64_t>(step) * kRowsPerStep + static_cast<uint64_t>(g);
  if (!data_) {
    for (int64_t t = 0; t <= T_; ++t) {
      const auto tok = static_cast<int32_t>(random_u64(seed_, index, t) % vocab_);
      if (t < T_) tokens[t] = tok;
      if (t > 0) targets[t - 1] = tok;
    }
    return;
  }
  const int64_t span = val_begin_ - T_ - 1;
  const int64_t off = static_cast<int64_t>(random_u64(seed_, stream_id("train"), index) %
                                           static_cast<uint64_t>(span + 1));
  data_->copy(tokens, off, T_);
  data_->copy(targets, off + 1, T_);
}

void Batches::train_micro_batch(int64_t step, int64_t micro, int rank, int world, int64_t B,
                                int32_t* tokens, int32_t* targets) const {
  const int64_t first = (micro * world + rank) * B;
  for (int64_t r = 0; r < B; ++r) train_row(step, first + r, tokens + r * T_, targets + r * T_);
}

void Batches::val_row(int64_t i, int64_t count, int32_t* tokens, int32_t* targets) const {
  const int64_t span = data_->size() - val_begin_ - T_ - 1;
  const int64_t off = val_begin_ + (count > 1 ? span * i / (count - 1) : 0);
  data_->copy(tokens, off, T_);
  data_->copy(targets, off + 1, T_);
}

}  // namespace anvil::data
