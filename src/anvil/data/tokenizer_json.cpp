// tokenizer.json for the byte tokenizer and SentencePiece BPE models, and
// the protobuf walk that reads a SentencePiece model's type.
#include "anvil/data/tokenizer_json.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <tuple>
#include <vector>

#include "anvil/base/files.hpp"

namespace anvil::data {

using json = nlohmann::json;

json bytes_tokenizer_json() {
  std::vector<int> chars(256, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    chars[b] = printable ? b : next++;
  }
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string utf8;  // the code point chars[b] in UTF-8 (all below 0x800)
    const int c = chars[b];
    if (c < 0x80) {
      utf8.push_back(static_cast<char>(c));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (c >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    vocab[utf8] = b;
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", json::array()}}}};
}

namespace {

bool read_varint(const std::string& b, size_t& i, uint64_t& v) {
  v = 0;
  for (int shift = 0; i < b.size() && shift < 64; shift += 7) {
    const auto c = static_cast<unsigned char>(b[i++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

// Walks the fields of the message in b[begin, end); `on` sees (field, wire
// type, varint value or length, payload begin, payload end). Stops at the
// first field it cannot read.
template <typename On>
void walk_fields(const std::string& b, size_t begin, size_t end, On&& on) {
  size_t i = begin;
  while (i < end) {
    uint64_t key = 0, v = 0;
    if (!read_varint(b, i, key)) return;
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 0) {
      if (!read_varint(b, i, v)) return;
      on(field, wire, v, i, i);
    } else if (wire == 2) {
      if (!read_varint(b, i, v) || v > end - i) return;
      on(field, wire, v, i, i + v);
      i += v;
    } else if (wire == 1) {
      i += 8;
    } else if (wire == 5) {
      i += 4;
    } else {
      return;
    }
  }
}

}  // namespace

int sentencepiece_model_type(const std::string& proto) {
  int type = 0;
  walk_fields(proto, 0, proto.size(), [&](int field, int wire, uint64_t, size_t b, size_t e) {
    if (field == 2 && wire == 2)
      walk_fields(proto, b, e, [&](int f, int w, uint64_t v, size_t, size_t) {
        if (f == 3 && w == 0) type = static_cast<int>(v);
      });
  });
  return type;
}

std::string sentencepiece_piece_problem(const std::string& proto) {
  std::string problem;
  int64_t index = 0;
  walk_fields(proto, 0, proto.size(), [&](int field, int wire, uint64_t, size_t b, size_t e) {
    if (field != 1 || wire != 2 || !problem.empty()) return;
    walk_fields(proto, b, e, [&](int f, int w, uint64_t, size_t pb, size_t pe) {
      if (f != 1 || w != 2 || !problem.empty()) return;
      if (pb == pe)
        problem = "piece " + std::to_string(index) + " is empty";
      else if (proto.find('\0', pb) < pe)
        problem = "piece " + std::to_string(index) + " contains a NUL byte";
    });
    ++index;
  });
  return problem;
}

// The vocabulary is SentencePiece's, with "\n" in place of "<nl>"; the merges are every split of a
// piece into two pieces, ranked by the merged piece's id (SentencePiece merges the best-scored
// piece first, and its BPE pieces are stored best first), as transformers' converter for
// SentencePiece models derives them.
json sentencepiece_tokenizer_json(const std::string& model_path) {
  if (!std::filesystem::is_regular_file(model_path)) return json();
  const std::string proto = read_file(model_path);
  if (!sentencepiece_piece_problem(proto).empty() || sentencepiece_model_type(proto) != 2)
    return json();
  sentencepiece::SentencePieceProcessor sp;
  try {
    if (!sp.LoadFromSerializedProto(proto).ok()) return json();
  } catch (const std::exception&) {
    return json();
  }
  const int n = sp.GetPieceSize();
  std::map<std::string, int> ids;
  json vocab = json::object();
  std::vector<std::string> piece(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    piece[i] = sp.IdToPiece(i) == "<nl>" && sp.IsControl(i) ? std::string("\n") : sp.IdToPiece(i);
    vocab[piece[i]] = i;
    if (!sp.IsControl(i) && !sp.IsUnknown(i) && !sp.IsByte(i)) ids[piece[i]] = i;
  }
  struct Merge {
    int merged, left, right;
  };
  std::vector<Merge> merges;
  for (const auto& [p, id] : ids) {
    for (size_t k = 1; k < p.size(); ++k) {
      if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // inside a character
      const auto l = ids.find(p.substr(0, k)), r = ids.find(p.substr(k));
      if (l != ids.end() && r != ids.end()) merges.push_back({id, l->second, r->second});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(a.merged, a.left, a.right) < std::tie(b.merged, b.left, b.right);
  });
  json merge_list = json::array();
  for (const auto& m : merges) merge_list.push_back({piece[m.left], piece[m.right]});
  const std::string space_mark = "\xE2\x96\x81";  // U+2581
  const json replace_in = {
      {"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space_mark}};
  const json replace_out = {
      {"type", "Replace"}, {"pattern", {{"String", space_mark}}}, {"content", " "}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", sp.unk_id()},
             {"content", sp.IdToPiece(sp.unk_id())},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", false},
             {"special", true}}}},
          {"normalizer", replace_in},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", {replace_out, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", sp.IdToPiece(sp.unk_id())},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

}  // namespace anvil::data
