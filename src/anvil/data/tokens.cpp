#include "anvil/data/tokens.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"

namespace anvil::data {
namespace {

constexpr char kMagic[8] = {'A', 'N', 'V', 'I', 'L', 'T', 'O', 'K'};
constexpr size_t kHeader = 64;

template <typename T>
T read_le(const unsigned char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

// The position of the first token >= vocab, or -1: one pass over the file as
// a max reduction (vectorised; memory-bound), and a second pass to find the
// position only when that fails.
template <typename T>
int64_t first_out_of_vocabulary(const T* tokens, int64_t n, int64_t vocab) {
  T most = 0;
#pragma omp simd reduction(max : most)
  for (int64_t i = 0; i < n; ++i) most = std::max(most, tokens[i]);
  if (static_cast<int64_t>(most) < vocab) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<int64_t>(tokens[i]) >= vocab) return i;
  }
  return -1;
}

}  // namespace

TokenData::TokenData(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  ::fstat(fd, &st);
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ == 0) {
    ::close(fd);
    throw InputError(path + ": empty file (expected a token file or text)");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw SystemError(path + ": mmap failed (" + std::strerror(errno) + ")");
  }
  const auto* bytes = static_cast<const unsigned char*>(map_);
  if (map_size_ >= kHeader && std::memcmp(bytes, kMagic, 8) == 0) {
    const auto version = read_le<uint32_t>(bytes + 8);
    width_ = static_cast<int>(read_le<uint32_t>(bytes + 12));
    const auto vocab = read_le<uint64_t>(bytes + 16);
    const auto count = read_le<uint64_t>(bytes + 24);
    auto bad = [&](const std::string& why) {
      ::munmap(map_, map_size_);
      map_ = nullptr;
      return InputError(path + ": " + why);
    };
    if (version != 1) throw bad("token file version " + std::to_string(version) + " (expected 1)");
    if (width_ != 2 && width_ != 4)
      throw bad("bytes per token " + std::to_string(width_) + " (expected 2 or 4)");
    // Token ids are int32 inside anvil: every id below the vocabulary must fit.
    if (vocab < 1 || vocab > static_cast<uint64_t>(INT32_MAX)) {
      throw bad("vocabulary " + std::to_string(vocab) + " (expected 1..2147483647)");
    }
    const uint64_t body = map_size_ - kHeader;
    if (count > body / static_cast<uint64_t>(width_) ||
        count * static_cast<uint64_t>(width_) != body) {
      throw bad("holds " + std::to_string(body) + " token bytes, header says " +
                std::to_string(count) + " tokens of " + std::to_string(width_) + " bytes");
    }
    vocab_ = static_cast<int64_t>(vocab);
    count_ = static_cast<int64_t>(count);
    tokens_ = bytes + kHeader;
    const int64_t at =
        width_ == 2
            ? first_out_of_vocabulary(static_cast<const uint16_t*>(tokens_), count_, vocab_)
            : first_out_of_vocabulary(static_cast<const uint32_t*>(tokens_), count_, vocab_);
    if (at >= 0) {
      const uint64_t id = width_ == 2 ? static_cast<const uint16_t*>(tokens_)[at]
                                      : static_cast<const uint32_t*>(tokens_)[at];
      throw bad("token " + std::to_string(id) + " at position " + std::to_string(at) +
                " is outside the header's vocabulary [0, " + std::to_string(vocab_) + ")");
    }
    tokenizer_ = "file";
    read_meta(path);
    return;
  }
  // A token file that lost its header must not train as its own bytes: a
  // .tok name, the magic's first bytes or a .tok.json beside it say it was one.
  const std::string_view name(path);
  if ((name.size() >= 4 && name.substr(name.size() - 4) == ".tok") ||
      (map_size_ >= 5 && std::memcmp(bytes, kMagic, 5) == 0) ||
      std::filesystem::exists(path + ".json")) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw InputError(path +
                     ": not a token file (no ANVILTOK header; a damaged or truncated one?), "
                     "expected a file from anvil data tokenize, or raw text under another name");
  }
  // Raw text: one token per byte, read from the mapping itself (no copy:
  // every rank of a node shares the page cache's one).
  tokens_ = bytes;
  width_ = 1;
  count_ = static_cast<int64_t>(map_size_);
  vocab_ = 256;
  tokenizer_ = "bytes";
}

TokenData::~TokenData() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void TokenData::read_meta(const std::string& path) {
  const std::string meta = path + ".json";
  if (!std::filesystem::exists(meta)) return;
  try {
    const auto j = nlohmann::json::parse(read_file(meta));
    const auto& t = j.at("tokenizer");
    const std::string kind = t.at("kind").get<std::string>();
    if (kind == "bytes") {
      tokenizer_ = "bytes";
      return;
    }
    if (kind != "sentencepiece")
      throw InputError(meta + ": tokenizer.kind " + t.at("kind").dump() +
                       " (expected bytes or sentencepiece)");
    tokenizer_ = "sentencepiece";
    tokenizer_model_ = t.at("model").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(meta + ": not an anvil-tokens-meta file (" + e.what() + ")");
  }
  if (!std::filesystem::is_regular_file(tokenizer_model_))
    throw InputError(meta + ": tokenizer.model " + tokenizer_model_ + ": no such file");
}

void write_token_meta(const std::string& token_file, const std::string& tokenizer_model,
                      const std::vector<std::string>& sources, int64_t tokens, int64_t bytes) {
  nlohmann::json src = nlohmann::json::array();
  for (const auto& s : sources) src.push_back(std::filesystem::absolute(s).string());
  const nlohmann::json j = {
      {"format", "anvil-tokens-meta"},
      {"version", 1},
      {"tokenizer",
       tokenizer_model.empty()
           ? nlohmann::json{{"kind", "bytes"}}
           : nlohmann::json{{"kind", "sentencepiece"},
                            {"model", std::filesystem::absolute(tokenizer_model).string()}}},
      {"sources", src},
      {"tokens", tokens},
      {"bytes", bytes}};
  write_file_atomic(token_file + ".json", j.dump(2) + "\n");
}

void TokenData::copy(int32_t* out, int64_t begin, int64_t n) const {
  const auto widen = [&](const auto* ids) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(ids[begin + i]);
  };
  switch (width_) {
    case 1:
      widen(static_cast<const unsigned char*>(tokens_));
      break;
    case 2:
      widen(static_cast<const uint16_t*>(tokens_));
      break;
    default:
      widen(static_cast<const uint32_t*>(tokens_));
  }
}

std::vector<int32_t> encode_bytes(const std::string& text) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (int32_t t : tokens) s.push_back(static_cast<char>(t & 0xff));
  return s;
}

namespace {

std::string token_header(int width, int64_t vocab_size, uint64_t count) {
  std::string header(kHeader, '\0');
  std::memcpy(header.data(), kMagic, 8);
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) header[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(8, 1, 4);
  put(12, static_cast<uint64_t>(width), 4);
  put(16, static_cast<uint64_t>(vocab_size), 8);
  put(24, count, 8);
  return header;
}

constexpr size_t kWriteBuffer = size_t{8} << 20;

}  // namespace

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t vocab_size)
    : file_(path), width_(vocab_size <= 65536 ? 2 : 4), vocab_(vocab_size) {
  file_.write(token_header(width_, vocab_, 0));  // the count comes at commit
}

void TokenFileWriter::append(const int32_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto t = static_cast<uint32_t>(ids[i]);
    for (int b = 0; b < width_; ++b) buffer_.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
    if (buffer_.size() >= kWriteBuffer) {
      file_.write(buffer_);
      buffer_.clear();
    }
  }
  count_ += static_cast<int64_t>(n);
}

void TokenFileWriter::append_bytes(std::string_view text) {
  for (const char c : text) {
    buffer_.push_back(c);  // little-endian: the byte, then zeros
    buffer_.append(static_cast<size_t>(width_ - 1), '\0');
    if (buffer_.size() >= kWriteBuffer) {
      file_.write(buffer_);
      buffer_.clear();
    }
  }
  count_ += static_cast<int64_t>(text.size());
}

void TokenFileWriter::commit() {
  file_.write(buffer_);
  buffer_.clear();
  file_.write_at(0, token_header(width_, vocab_, static_cast<uint64_t>(count_)));
  file_.commit();
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      int64_t vocab_size) {
  TokenFileWriter w(path, vocab_size);
  w.append(tokens.data(), tokens.size());
  w.commit();
}

bool same_tokenizer(const std::string& kind_a, const std::string& model_a,
                    const std::string& kind_b, const std::string& model_b) {
  if (kind_a != kind_b) return false;
  if (model_a == model_b) return true;
  if (model_a.empty() || model_b.empty()) return false;
  return read_file(model_a) == read_file(model_b);
}

}  // namespace anvil::data
