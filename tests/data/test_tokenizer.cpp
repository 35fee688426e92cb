// SentencePiece tokenizers: what anvil trains round-trips text byte for
// byte (spaces, tabs, blank lines, characters never seen in training), the
// ids do not depend on the thread count, and bad input is a one-line error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/data/tokenize.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/data/tokens.hpp"

namespace {

using anvil::data::Tokenizer;

// A few kilobytes of English-like lines to train on.
std::string corpus() {
  const char* words[] = {"the", "king", "said", "unto", "them", "and", "of", "land", "went",
                         "into", "city", "people", "which", "shall", "be", "a", "great"};
  std::string s;
  uint64_t x = 12345;
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 12; ++w) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      s += words[(x >> 33) % 17];
      s += w + 1 < 12 ? " " : (line % 7 == 0 ? ".\n\n" : ",\n");
    }
  }
  return s;
}

std::string train(const std::string& name, const std::string& type, int vocab = 310) {
  const std::string dir = testing::TempDir() + "/tokenizer_" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/text.txt") << corpus();
  anvil::data::TokenizerTrainOptions o;
  o.texts = {dir + "/text.txt"};
  o.out_prefix = dir + "/tk";
  o.vocab_size = vocab;
  o.type = type;
  o.special = {"<|endoftext|>"};
  const auto r = anvil::data::train_tokenizer(o);
  EXPECT_EQ(r.vocab_size, vocab);
  EXPECT_TRUE(std::filesystem::exists(dir + "/tk.vocab"));
  return r.model_path;
}

}  // namespace

TEST(Tokenizer, BpeAndUnigramRoundTripAnyTextByteForByte) {
  for (const std::string type : {"bpe", "unigram"}) {
    const Tokenizer tk(train(type, type));
    EXPECT_GE(tk.newline_id(), 0);
    const std::string text = corpus() +
                             "  two leading spaces, trailing   \n\ttab\r\n"
                             "unseen: ünïcödé — “quotes” 日本語 🎉 {x[i] = y;} <nl> <unk> \u2581 a\u2581\u2581b\n\n\nend";
    const auto ids = tk.encode(text);
    EXPECT_EQ(tk.decode(ids), text) << type;
    // Clearly fewer tokens than bytes on the text it was trained on.
    EXPECT_LT(tk.encode(corpus()).size() * 3, corpus().size() * 2) << type;
    // The same ids on any number of threads (cut at line boundaries).
    std::string big;
    for (int i = 0; i < 40; ++i) big += text + "\n";
    const auto one = tk.encode(big, 1);
    EXPECT_EQ(tk.encode(big, 2), one) << type;
    EXPECT_EQ(tk.encode(big, 3), one) << type;
    EXPECT_EQ(tk.decode(one), big) << type;
  }
}

TEST(Tokenizer, SpecialTokensAreOneIdEach) {
  const Tokenizer tk(train("special", "bpe"));
  const auto ids = tk.encode("<|endoftext|>");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(tk.piece(ids[0]), "<|endoftext|>");
}

// What SentencePiece would drop or replace is found, by offset: stray
// continuation bytes, truncated sequences, overlong forms, surrogates and
// code points past U+10FFFF; every valid length passes.
TEST(Tokenizer, InvalidUtf8IsFoundAtItsFirstByte) {
  using anvil::data::first_invalid_utf8;
  constexpr size_t kValid = std::string_view::npos;
  EXPECT_EQ(first_invalid_utf8("plain, \xC3\xA9t\xC3\xA9 \xE2\x96\x81 \xF0\x9F\x98\x80"), kValid);
  EXPECT_EQ(first_invalid_utf8(""), kValid);
  EXPECT_EQ(first_invalid_utf8("ab\xFF"
                               "cd"),
            2u);
  EXPECT_EQ(first_invalid_utf8("a\x80"), 1u);             // a continuation byte alone
  EXPECT_EQ(first_invalid_utf8("a\xE2\x96"), 1u);         // cut short
  EXPECT_EQ(first_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(first_invalid_utf8("\xE0\x80\xAF"), 0u);      // overlong, 3 bytes
  EXPECT_EQ(first_invalid_utf8("x\xED\xA0\x80"), 1u);     // a surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(first_invalid_utf8("\xE2(\xA1"), 0u);         // a bad second byte
}

TEST(Tokenizer, BadInputIsAOneLineError) {
  const std::string dir = testing::TempDir() + "/tokenizer_bad";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/not-a-model") << "hello";
  try {
    Tokenizer tk(dir + "/not-a-model");
    FAIL() << "loaded a text file as a model";
  } catch (const anvil::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a SentencePiece model"), std::string::npos);
  }
  // A piece starting with a NUL byte (found by fuzz/tokenizer_fuzz.cpp):
  // SentencePiece's trie builder throws its own exception from inside Load.
  const std::string nul_piece(
      "\x0a\x0e\x0a\x05<unk>\x15\0\0\0\0\x18\x02\x0a\x0d\x0a\x04<nl>\x15\0\0\0\0\x18\x03"
      "\x0a\x0f\x0a\x06\0*x00>\x15\0\x02\x00" "00x0B", 50);
  std::ofstream(dir + "/nul-piece.model") << nul_piece;
  try {
    Tokenizer tk(dir + "/nul-piece.model");
    FAIL() << "loaded a model with a NUL-byte piece";
  } catch (const anvil::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("piece 2 contains a NUL byte"), std::string::npos)
        << e.what();
  }
  anvil::data::TokenizerTrainOptions o;
  o.texts = {dir + "/missing.txt"};
  o.out_prefix = dir + "/x";
  EXPECT_THROW(anvil::data::train_tokenizer(o), anvil::InputError);
  std::ofstream(dir + "/t.txt") << corpus();
  o.texts = {dir + "/t.txt"};
  o.vocab_size = 100;  // below 256 bytes + symbols
  EXPECT_THROW(anvil::data::train_tokenizer(o), anvil::InputError);
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.model"));
  const Tokenizer tk(train("bad_ids", "bpe"));
  EXPECT_THROW(tk.decode({1, 5000}), anvil::InputError);
}

// anvil data tokenize reads its texts in blocks: the ids are those of the
// whole concatenated text across block and file boundaries (a file's last
// line without a newline joins the next file's first), bytes and
// SentencePiece alike; a non-UTF-8 byte is named at its place in its file.
TEST(Tokenizer, TokenizingInBlocksGivesTheWholeTextsIds) {
  namespace fs = std::filesystem;
  const std::string model = train("blocks", "bpe");
  const std::string dir = testing::TempDir() + "/tokenize_blocks";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string a = corpus() + "caf\xc3\xa9 na\xc3\xafve", b = "t\xc3\xaate\nend of the land\n";
  std::ofstream(dir + "/a.txt") << a;  // no newline at its end
  std::ofstream(dir + "/b.txt") << b;
  const Tokenizer tk(model);
  for (const bool bytes : {true, false}) {
    anvil::data::TokenizeOptions o;
    o.texts = {dir + "/a.txt", dir + "/b.txt"};
    o.out = dir + (bytes ? "/bytes.tok" : "/sp.tok");
    o.tokenizer = bytes ? "" : model;
    o.block_bytes = 1000;  // dozens of blocks
    o.verify = !bytes;
    const auto r = anvil::data::tokenize_files(o);
    EXPECT_EQ(r.bytes, static_cast<int64_t>(a.size() + b.size()));
    const anvil::data::TokenData d(o.out);
    std::vector<int32_t> got(static_cast<size_t>(d.size()));
    d.copy(got.data(), 0, d.size());
    const auto want = bytes ? anvil::data::encode_bytes(a + b) : tk.encode(a + b);
    EXPECT_EQ(got, want) << (bytes ? "bytes" : "sentencepiece");
    EXPECT_TRUE(fs::exists(o.out + ".json"));
  }
  std::ofstream(dir + "/bad.txt") << corpus() << "ok\n\xff\n";
  anvil::data::TokenizeOptions bad;
  bad.texts = {dir + "/bad.txt"};
  bad.out = dir + "/bad.tok";
  bad.tokenizer = model;
  bad.block_bytes = 1000;
  try {
    anvil::data::tokenize_files(bad);
    ADD_FAILURE() << "no InputError";
  } catch (const anvil::InputError& e) {
    EXPECT_NE(
        std::string(e.what()).find("not UTF-8 at byte " + std::to_string(corpus().size() + 3)),
        std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/bad.tok"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()),
            7);  // no temporary
}
