// `anvil data tokenize`: text files to a token file, with a SentencePiece
// tokenizer or one token per byte, optionally decoded again and compared
// with the text byte for byte before anything is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anvil::data {

struct TokenizeOptions {
  std::vector<std::string> texts;  // concatenated in order
  std::string out;                 // the token file (+ OUT.json)
  std::string tokenizer;           // SentencePiece model; "" : bytes
  int threads = 2;
  bool verify = false;
  // Read and encoded this many bytes at a time (tests: small, to cross
  // many block boundaries).
  size_t block_bytes = size_t{16} << 20;
};

struct TokenizeResult {
  int64_t tokens = 0, bytes = 0, vocab = 0;
  double seconds = 0;     // encoding
  bool verified = false;  // decoded back exactly (with verify)
  bool differs = false;   // with verify: the round trip differs; nothing written
  int64_t first_difference = 0, decoded_bytes = 0;
};

TokenizeResult tokenize_files(const TokenizeOptions& options);

}  // namespace anvil::data
