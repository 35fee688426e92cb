// Where training and validation rows come from, for any number of
// data-parallel ranks. A step's global batch is `rows_per_step` rows
// (micro-batch x accumulation x ranks); global row g of step s starts at an
// offset drawn from (seed, s, g), so the rows a step trains on do not depend
// on how they are split: rank r's micro-batch m holds global rows
// [(m * world + r) * B, ... + B), and the union over ranks and micro-batches
// is exactly the one-process global batch. Validation rows are fixed and
// evenly spaced over the held-out tail. Without a file, tokens are random
// (throughput benchmarks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "anvil/data/tokens.hpp"

namespace anvil::data {

class Batches {
 public:
  // Throws InputError naming `path` when its vocabulary exceeds `vocab` or it
  // is too short for rows of T tokens with that validation fraction.
  Batches(const std::string& path, int64_t vocab, uint64_t seed, int64_t T, double val_fraction);

  bool has_data() const { return data_ != nullptr; }
  bool has_validation() const { return data_ != nullptr && val_begin_ < data_->size(); }
  std::string tokenizer() const { return data_ ? data_->tokenizer() : "random"; }
  std::string tokenizer_model() const { return data_ ? data_->tokenizer_model() : ""; }

  // Global row g of `step`: T input tokens and their T next tokens.
  void train_row(int64_t step, int64_t g, int32_t* tokens, int32_t* targets) const;
  // Rank `rank` of `world`, micro-batch `micro`: its B rows, [B, T] each.
  void train_micro_batch(int64_t step, int64_t micro, int rank, int world, int64_t B,
                         int32_t* tokens, int32_t* targets) const;
  // Validation row i of `count` evenly spaced rows.
  void val_row(int64_t i, int64_t count, int32_t* tokens, int32_t* targets) const;

 private:
  uint64_t seed_;
  int64_t T_, vocab_;
  std::unique_ptr<TokenData> data_;
  int64_t val_begin_ = 0;
};

}  // namespace anvil::data
