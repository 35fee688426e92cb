// Where training and validation rows come from, for any number of
// data-parallel ranks. A step's global batch is `rows_per_step` rows
// (micro-batch x accumulation x ranks); global row g of step s starts at an
// offset drawn from (seed, s, g), so the rows a step trains on do not depend
// on how they are split: rank r's micro-batch m holds global rows
// [(m * world + r) * B, ... + B), and the union over ranks and micro-batches
// is exactly the one-process global batch. Validation rows are fixed and
// evenly spaced over the held-out tail. Without a file, tokens are random
// (throughput benchmarks).
//
// A mixture (a recipe phase's data) has several token files with weights:
// global row g of step s first draws its source from (seed, s, g) with
// those weights, then its offset inside that source's training span; each
// source holds out its own tail, and validation rows take the sources in
// turn (row i from source i mod n).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "anvil/data/tokens.hpp"

namespace anvil::data {

struct Source {
  std::string path;
  double weight = 1;
};

// "PATH" or "PATH:WEIGHT,PATH:WEIGHT,..." (a mixture); InputError naming
// `flag` for a malformed list or a weight that is not > 0.
std::vector<Source> parse_sources(const std::string& spec, const std::string& flag);

class Batches {
 public:
  // Throws InputError naming `path` when its vocabulary exceeds `vocab` or it
  // is too short for rows of T tokens with that validation fraction.
  Batches(const std::string& path, int64_t vocab, uint64_t seed, int64_t T, double val_fraction);
  // A mixture; the sources must share a tokenizer. Empty: random tokens.
  Batches(const std::vector<Source>& sources, int64_t vocab, uint64_t seed, int64_t T,
          double val_fraction);

  bool has_data() const { return !data_.empty(); }
  bool has_validation() const;
  std::string tokenizer() const { return data_.empty() ? "random" : data_[0]->tokenizer(); }
  std::string tokenizer_model() const {
    return data_.empty() ? "" : data_[0]->tokenizer_model();
  }

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
  std::vector<std::unique_ptr<TokenData>> data_;
  std::vector<int64_t> val_begin_;  // per source: where its held-out tail starts
  std::vector<double> cumulative_;  // normalised cumulative weights
};

}  // namespace anvil::data
