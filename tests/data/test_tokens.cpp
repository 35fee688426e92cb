// Token files: a round trip, text read as bytes, and every id checked
// against the header's vocabulary when a file is opened.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/data/tokens.hpp"
#include "support/input_error.hpp"

namespace anvil::data {
namespace {

using test_support::expect_input_error;

// A token file "anvil-tokens" v1 with the given header fields and body.
std::string raw_token_file(const std::string& name, uint32_t width, uint64_t vocab, uint64_t count,
                           const std::string& body) {
  std::string header(64, '\0');
  header.replace(0, 8, "ANVILTOK");
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) header[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(8, 1, 4);
  put(12, width, 4);
  put(16, vocab, 8);
  put(24, count, 8);
  const std::string path = testing::TempDir() + "/" + name + ".tok";
  write_file_atomic(path, header + body);
  return path;
}

TEST(TokenFile, RoundTripsAndTextIsReadAsBytes) {
  const std::string dir = testing::TempDir();
  data::write_token_file(dir + "/t.tok", {0, 5, 65535, 7}, 65536);
  data::TokenData t(dir + "/t.tok");
  EXPECT_EQ(t.size(), 4);
  EXPECT_EQ(t[2], 65535);
  EXPECT_EQ(t.tokenizer(), "file");
  data::write_token_file(dir + "/w.tok", {70000, 1}, 100000);  // needs 4-byte tokens
  EXPECT_EQ(data::TokenData(dir + "/w.tok")[0], 70000);
  write_file_atomic(dir + "/x.txt", "Hi!");
  data::TokenData text(dir + "/x.txt");
  EXPECT_EQ(text.tokenizer(), "bytes");
  EXPECT_EQ(text.size(), 3);
  EXPECT_EQ(text[1], 'i');
  std::string broken(64 + 3, '\0');
  broken.replace(0, 8, "ANVILTOK");
  broken[8] = 1;
  broken[12] = 2;
  broken[24] = 2;  // says 2 tokens, holds 1.5
  write_file_atomic(dir + "/b.tok", broken);
  EXPECT_THROW(data::TokenData(dir + "/b.tok"), InputError);
}

TEST(TokenFile, EveryIdIsCheckedAgainstTheVocabularyWhenOpened) {
  auto u16 = [](std::vector<uint16_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
  };
  auto u32 = [](std::vector<uint32_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  auto check = [](const std::string& path, const std::vector<std::string>& parts) {
    std::vector<std::string> all = {path + ": "};
    all.insert(all.end(), parts.begin(), parts.end());
    expect_input_error([&] { data::TokenData t(path); }, all);
  };
  // Long enough for the vectorised pass to run whole vectors; the first bad
  // id is reported, not the largest.
  std::vector<uint16_t> ids(1000, 7);
  ids[999] = 255;
  EXPECT_EQ(data::TokenData(raw_token_file("ok16", 2, 256, ids.size(), u16(ids)))[999], 255);
  ids[613] = 256;
  ids[870] = 65535;
  check(raw_token_file("bad16", 2, 256, ids.size(), u16(ids)),
        {"token 256 at position 613 is outside the header's vocabulary [0, 256)"});
  ids.assign(1000, 7);
  ids[0] = 300;
  check(raw_token_file("bad16_first", 2, 256, ids.size(), u16(ids)), {"token 300 at position 0"});
  std::vector<uint32_t> wide(333, 99999);
  wide[332] = 100000;
  check(raw_token_file("bad32", 4, 100000, wide.size(), u32(wide)),
        {"token 100000 at position 332", "[0, 100000)"});
  wide[332] = 4000000000u;  // past int32: would read back as a negative id
  check(raw_token_file("bad32_sign", 4, 100000, wide.size(), u32(wide)),
        {"token 4000000000 at position 332"});
  check(raw_token_file("vocab0", 2, 0, 1, u16({0})), {"vocabulary 0 (expected 1..2147483647)"});
  check(raw_token_file("vocab_huge", 4, uint64_t{1} << 40, 1, u32({0})),
        {"vocabulary 1099511627776"});
  // 2^63 tokens of 2 bytes wrap to 0 bytes: refused, not read as empty.
  check(raw_token_file("count_wrap", 2, 256, uint64_t{1} << 63, ""),
        {"header says 9223372036854775808 tokens"});
}

}  // namespace
}  // namespace anvil::data
