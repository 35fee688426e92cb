// tokenizer.json for the byte tokenizer, and the SentencePiece model-type
// reader on hand-made protobufs.
#include <gtest/gtest.h>

#include <string>

#include "anvil/data/tokenizer_json.hpp"

namespace anvil::data {
namespace {

TEST(TokenizerJson, BytesAreTheirOwnIdsWithoutMerges) {
  const auto j = bytes_tokenizer_json();
  const auto& vocab = j["model"]["vocab"];
  EXPECT_EQ(vocab.size(), 256u);
  EXPECT_EQ(vocab["A"], 65);
  EXPECT_EQ(vocab["\xC4\xA0"], 32);  // GPT-2's printable stand-in for the space, U+0120
  EXPECT_TRUE(j["model"]["merges"].empty());
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
}

TEST(TokenizerJson, ReadsTheModelTypeFromTheTrainerSpec) {
  // ModelProto field 2 (trainer_spec, length-delimited) holding field 3
  // (model_type, varint) = 2: BPE.
  EXPECT_EQ(sentencepiece_model_type(std::string("\x12\x02\x18\x02", 4)), 2);
  // Other fields around it are skipped: a varint field 1, a fixed64 field 4.
  const std::string around("\x08\x05\x21\x00\x00\x00\x00\x00\x00\x00\x00\x12\x02\x18\x01", 15);
  EXPECT_EQ(sentencepiece_model_type(around), 1);
  EXPECT_EQ(sentencepiece_model_type(""), 0);
  EXPECT_EQ(sentencepiece_model_type(std::string("\x12\x09\x18", 3)), 0);  // truncated
}

TEST(TokenizerJson, PiecesSentencePieceCannotTakeAreNamed) {
  // ModelProto field 1 (pieces) holding SentencePiece field 1 (piece).
  EXPECT_EQ(sentencepiece_piece_problem(std::string("\x0a\x03\x0a\x01" "a", 5)), "");
  EXPECT_EQ(sentencepiece_piece_problem(std::string("\x0a\x03\x0a\x01" "a\x0a\x02\x0a\x00", 9)),
            "piece 1 is empty");
  EXPECT_EQ(sentencepiece_piece_problem(std::string("\x0a\x04\x0a\x02" "a\0", 6)),
            "piece 0 contains a NUL byte");
  EXPECT_EQ(sentencepiece_piece_problem(""), "");
}

TEST(TokenizerJson, AnythingButASentencePieceModelGivesNoTokenizer) {
  EXPECT_TRUE(sentencepiece_tokenizer_json("/nonexistent.model").is_null());
}

}  // namespace
}  // namespace anvil::data
