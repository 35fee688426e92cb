// SentencePiece tokenizers through Debian's libsentencepiece (docs/data.md):
// `anvil data tokenizer train` (BPE or unigram) and the Tokenizer that
// `anvil data tokenize`, `anvil generate` and evaluation use.
//
// SentencePiece works on lines; a newline is a piece of its own ("<nl>", a
// control symbol: only the line splitter emits it, a literal "<nl>" in the
// text stays text), so text round-trips with its line structure. Models
// anvil trains use identity normalisation, keep every space (no dummy
// prefix, no whitespace folding) and fall back to bytes for characters
// outside the vocabulary, so decode(encode(text)) == text for UTF-8 text
// (a literal U+2581, SentencePiece's own mark for a space, goes out as its
// three byte pieces).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace anvil::data {

inline constexpr const char* kNewlinePiece = "<nl>";
inline constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581

struct TokenizerTrainOptions {
  std::vector<std::string> texts;  // UTF-8 text files
  std::string out_prefix;          // writes PREFIX.model and PREFIX.vocab
  int vocab_size = 4096;
  std::string type = "bpe";  // bpe | unigram
  bool byte_fallback = true;
  std::vector<std::string> special;  // user-defined symbols, one id each
  int threads = 2;
  int64_t max_lines = 2'000'000;  // lines sampled for training (0: all)
};

struct TokenizerTrainResult {
  std::string model_path, vocab_path;
  int vocab_size = 0;
  int64_t lines = 0;  // trained on: the non-empty lines, at most max_lines of them
  double seconds = 0;
};

// Throws InputError naming the flag or file on bad options or input.
TokenizerTrainResult train_tokenizer(const TokenizerTrainOptions& options);

class Tokenizer {
 public:
  // Throws InputError naming `model_path` when it is not a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  int64_t vocab_size() const;
  int32_t newline_id() const { return newline_; }  // -1: the model has no "<nl>"
  const std::string& path() const { return path_; }
  // Lines encoded on `threads` threads (cut at line boundaries, so the ids
  // do not depend on the thread count), joined by the newline id; progress
  // shown for 16 MiB and more unless the caller shows its own.
  std::vector<int32_t> encode(std::string_view text, int threads = 1, bool progress = true) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;

 private:
  // `done` (when given) counts the bytes encoded so far, line by line.
  void encode_lines(std::string_view text, std::vector<int32_t>& out,
                    std::atomic<size_t>* done = nullptr) const;
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t newline_ = -1;
  int space_mark_[3] = {-1, -1, -1};  // byte pieces of U+2581 ([0] = -1: none)
};

// A run's text <-> ids, by the tokenizer kind its state.json records:
// "bytes" (one token per byte) or "sentencepiece" (its model file); any
// other kind ("file", "random") has no text.
// The offset of the first byte that does not begin or continue a valid UTF-8
// sequence (overlong forms and surrogates included), or npos. SentencePiece
// would drop or replace such bytes: its callers refuse them.
size_t first_invalid_utf8(std::string_view text);

class TextCodec {
 public:
  // Throws InputError naming `where` for a SentencePiece run without its model.
  TextCodec(const std::string& kind, const std::string& model_path, const std::string& where);
  const std::string& kind() const { return kind_; }
  bool has_text() const { return kind_ == "bytes" || sp_ != nullptr; }
  // Throws InputError naming `flag` when the run has no text tokenizer.
  std::vector<int32_t> encode(const std::string& text, const std::string& flag) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  std::string kind_;
  std::unique_ptr<Tokenizer> sp_;
};

}  // namespace anvil::data
