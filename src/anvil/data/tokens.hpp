// Training tokens: a binary token file (memory-mapped) or raw text read
// through the byte-level tokenizer (one token per byte, vocabulary 256).
//
// Token file format "anvil-tokens" v1 (little-endian), 64-byte header:
//   0  char[8]  magic "ANVILTOK"
//   8  u32      version (1)
//  12  u32      bytes per token (2 = uint16, 4 = uint32)
//  16  u64      vocabulary size (every token is < this; checked on opening)
//  24  u64      number of tokens
//  32  u8[32]   zero
//  64  tokens
// A token file written by `anvil data tokenize --tokenizer MODEL` has a
// sidecar FILE.json ("anvil-tokens-meta": the tokenizer kind and model path,
// the sources) so a run knows how to decode what it trained on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "anvil/base/files.hpp"

namespace anvil::data {

class TokenData {
 public:
  // A token file (by its magic) or, otherwise, UTF-8 text tokenized by bytes.
  // Throws InputError naming the file for a bad header or the first id at or
  // past the header's vocabulary (all ids are checked here, once).
  explicit TokenData(const std::string& path);
  ~TokenData();
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  int64_t size() const { return count_; }
  int64_t vocab_size() const { return vocab_; }
  // "bytes", "file" (ids without a known tokenizer) or "sentencepiece".
  const std::string& tokenizer() const { return tokenizer_; }
  // The SentencePiece model named by the sidecar ("" otherwise).
  const std::string& tokenizer_model() const { return tokenizer_model_; }
  int32_t operator[](int64_t i) const {
    switch (width_) {
      case 1:  // raw text, mapped as it is
        return static_cast<const unsigned char*>(tokens_)[i];
      case 2:
        return static_cast<const uint16_t*>(tokens_)[i];
      default:
        return static_cast<int32_t>(static_cast<const uint32_t*>(tokens_)[i]);
    }
  }
  // Copies tokens [begin, begin + n) into out.
  void copy(int32_t* out, int64_t begin, int64_t n) const;

 private:
  void read_meta(const std::string& path);
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  int width_ = 2;  // bytes per id: 2 or 4 in a token file, 1 for raw text
  std::string tokenizer_, tokenizer_model_;
  const void* tokens_ = nullptr;
  void* map_ = nullptr;
  size_t map_size_ = 0;
};

// Byte-level tokenizer.
std::vector<int32_t> encode_bytes(const std::string& text);
std::string decode_bytes(const std::vector<int32_t>& tokens);

// Whether two tokenizers (kind: "bytes", "sentencepiece", ...; and the
// SentencePiece model file, "" for none) encode alike: the same kind and the
// same model bytes (a copy of a model is the same tokenizer).
bool same_tokenizer(const std::string& kind_a, const std::string& model_a,
                    const std::string& kind_b, const std::string& model_b);

// A token file written as its tokens come (a corpus larger than memory):
// the header's count is patched in at commit(), which makes the file appear
// whole at `path` (AtomicFile); destroyed uncommitted, it leaves nothing.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, int64_t vocab_size);
  void append(const int32_t* ids, size_t n);
  void append_bytes(std::string_view text);  // the byte tokenizer: one id per byte
  int64_t count() const { return count_; }
  void commit();

 private:
  AtomicFile file_;
  int width_;
  int64_t vocab_;
  int64_t count_ = 0;
  std::string buffer_;
};

// Writes a token file atomically.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      int64_t vocab_size);

// The sidecar of a token file (PATH.json), written atomically; an empty
// `tokenizer_model` means the byte tokenizer.
void write_token_meta(const std::string& token_file, const std::string& tokenizer_model,
                      const std::vector<std::string>& sources, int64_t tokens, int64_t bytes);

}  // namespace anvil::data
