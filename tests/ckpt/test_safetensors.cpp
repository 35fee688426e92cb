// safetensors files: a round trip, and every malformed header refused with
// one line naming the file and the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/hf_files.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/tensor/tensor.hpp"
#include "support/input_error.hpp"

namespace anvil::ckpt {
namespace {

using test_support::expect_input_error;

// A safetensors file from a header text and `data_bytes` zero bytes of data.
std::string raw_safetensors(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = testing::TempDir() + "/" + name + ".safetensors";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file_atomic(path, bytes + header + std::string(data_bytes, '\0'));
  return path;
}

TEST(Safetensors, RoundTripsAndNamesTheFileOnBadInput) {
  const std::string path = testing::TempDir() + "/t.safetensors";
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  ckpt::write_safetensors(path, {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"k", "v"}});
  const auto f = ckpt::read_safetensors(path);
  EXPECT_EQ(f.get("a", {2, 3}).data, a);
  EXPECT_EQ(f.get("b", {1}).data, b);
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_THROW(f.get("a", {3, 2}), InputError);
  EXPECT_THROW(f.get("c", {1}), InputError);
  write_file_atomic(path, std::string("\x05\0\0\0\0\0\0\0{bad}", 13));
  EXPECT_THROW(ckpt::read_safetensors(path), InputError);
}

// A reader opened on a file reads its tensors one at a time (BF16 widened);
// a transformers directory's tensors are found across its index's files,
// and a tensor that two of them hold is refused, naming both.
TEST(Safetensors, TensorsAreReadOneAtATimeAcrossAnIndexsFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "st_index";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f}, c = {0.25f, 8};
  const std::vector<uint16_t> c16 = {0x3e80, 0x4100};  // 0.25 and 8 in bfloat16
  ckpt::write_safetensors((dir / "one.safetensors").string(),
                          {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}});
  ckpt::write_safetensors((dir / "two.safetensors").string(), {{"c", {2}, c.data(), c16.data()}});
  write_file_atomic((dir / "model.safetensors.index.json").string(),
                    R"({"weight_map": {"a": "one.safetensors", "b": "one.safetensors",
                                       "c": "two.safetensors"}})");
  const SafetensorsReader one((dir / "one.safetensors").string());
  EXPECT_EQ(one.shapes().size(), 2u);
  EXPECT_EQ(one.read("b").data, b);
  expect_input_error([&] { one.read("c"); }, {"one.safetensors: tensor c: absent"});
  const HfWeights weights(dir);
  EXPECT_EQ(weights.shapes().at("a"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(weights.read("a").data, a);
  EXPECT_EQ(weights.read("c").data, c);
  ckpt::write_safetensors((dir / "two.safetensors").string(),
                          {{"c", {2}, c.data()}, {"a", {6}, a.data()}});
  expect_input_error([&] { HfWeights{dir}; },
                     {"two.safetensors: tensor a is in ", "one.safetensors too"});
}

TEST(Safetensors, EachMalformedHeaderIsOneLineNamingTheFileAndTensor) {
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  auto check = [&](const std::string& name, const std::string& header, size_t data,
                   std::vector<std::string> parts) {
    const std::string path = raw_safetensors(name, header, data);
    parts.insert(parts.begin(), path + ": ");
    expect_input_error([&] { ckpt::read_safetensors(path); }, parts);
  };
  // Well formed, both dtypes: the checks below are what rejects the others.
  const auto good = ckpt::read_safetensors(raw_safetensors(
      "st_good",
      "{" + entry("a", "F32", "[2,3]", 0, 24) + "," + entry("b", "BF16", "[3]", 24, 30) + "," +
          entry("e", "F32", "[0,4]", 30, 30) + "," + entry("f", "BF16", "[0]", 30, 30) +
          ",\"__metadata__\":{\"format\":\"pt\"}}",
      30));
  EXPECT_EQ(good.tensors.at("b").data.size(), 3u);
  // Zero-element tensors load as empty, in either dtype.
  EXPECT_TRUE(good.tensors.at("e").data.empty());
  EXPECT_TRUE(good.tensors.at("f").data.empty());
  EXPECT_EQ(good.metadata.at("format"), "pt");

  EXPECT_EQ(tensor::checked_numel({int64_t{1} << 62, 4}), -1);
  EXPECT_EQ(tensor::checked_numel({0, -1}), -1);
  EXPECT_EQ(tensor::checked_numel({int64_t{1} << 62, 0}), 0);
  EXPECT_THROW(tensor::numel({3, -1}), std::invalid_argument);
  check("st_negative", "{" + entry("a", "F32", "[-1,4]", 0, 16) + "}", 16,
        {"tensor a: ", "dimension -1 is negative"});
  // 2^62 x 4 elements wrap to 0 in int64 (and so to 0 bytes): refused, not read as empty.
  check("st_numel_overflow", "{" + entry("a", "F32", "[4611686018427387904,4]", 0, 0) + "}", 0,
        {"tensor a: ", "overflows"});
  // 2^62 elements fit, 2^64 bytes of F32 do not.
  check("st_bytes_overflow", "{" + entry("a", "F32", "[4611686018427387904]", 0, 0) + "}", 0,
        {"tensor a: ", "overflows"});
  check("st_huge_dim", "{" + entry("a", "F32", "[18446744073709551615]", 0, 0) + "}", 0,
        {"tensor a: ", "dimension 18446744073709551615"});
  check("st_float_dim", "{" + entry("a", "F32", "[2.5]", 0, 8) + "}", 8,
        {"tensor a: ", "dimension 2.5"});
  check("st_meta_number", "{" + entry("a", "F32", "[1]", 0, 4) + ",\"__metadata__\":{\"step\":5}}",
        4, {"__metadata__: step is 5 (expected a string)"});
  check("st_meta_array", "{\"__metadata__\":[1]}", 0,
        {"__metadata__ is [1] (expected an object of strings)"});
  check("st_duplicate",
        "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[2]", 4, 12) + "}", 12,
        {"tensor a: named twice"});
  check("st_overlap",
        "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 8, 24) + "}", 24,
        {"tensor b: data_offsets [8, 24] overlap tensor a's [0, 16]"});
  check("st_same_range",
        "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 0, 16) + "}", 16,
        {"tensor b: ", "overlap tensor a's [0, 16]"});
  check("st_reversed", "{" + entry("a", "F32", "[0]", 16, 0) + "}", 16,
        {"tensor a: data_offsets [16, 0]: end before begin"});
  check("st_past_end", "{" + entry("a", "F32", "[4]", 0, 16) + "}", 12,
        {"tensor a: data_offsets [0, 16]: past the end", "expected end <= 12"});
  check("st_f32_size", "{" + entry("a", "F32", "[2,3]", 0, 12) + "}", 12,
        {"tensor a: data_offsets [0, 12]: 12 bytes (expected 24 for F32 [2,3])"});
  check("st_bf16_size", "{" + entry("a", "BF16", "[2,3]", 0, 24) + "}", 24,
        {"tensor a: ", "24 bytes (expected 12 for BF16 [2,3])"});
  check("st_dtype", "{" + entry("a", "F16", "[1]", 0, 2) + "}", 2,
        {"tensor a: dtype F16 (expected F32 or BF16)"});
  check("st_negative_offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
        4, {"tensor a: data_offsets [-4,0]"});
  check("st_not_object", "[1,2]", 0, {"header is [1,2], expected an object"});
}

}  // namespace
}  // namespace anvil::ckpt
