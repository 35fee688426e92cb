#include "anvil/ckpt/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "anvil/base/bf16.hpp"
#include "anvil/base/checksum.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/tensor/tensor.hpp"

namespace anvil::ckpt {

namespace {

// A file's header (8-byte length + JSON, padded so the data starts 8-byte
// aligned) and each tensor's byte range after it.
struct Layout {
  std::string prefix;
  std::vector<WrittenTensor> ranges;
  // The prefix, then every tensor's bytes, from the tensors' data.
  std::vector<std::string_view> pieces(const std::vector<TensorRef>& tensors) const {
    std::vector<std::string_view> out{prefix};
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorRef& t = tensors[i];
      out.emplace_back(
          t.bf16 ? reinterpret_cast<const char*>(t.bf16) : reinterpret_cast<const char*>(t.data),
          static_cast<size_t>(ranges[i].end - ranges[i].begin));
    }
    return out;
  }
};

Layout layout_of(const std::vector<TensorRef>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  Layout l;
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  auto size_of = [](const TensorRef& t) {
    return static_cast<uint64_t>(tensor::numel(t.shape)) * (t.is_bf16() ? 2 : sizeof(float));
  };
  for (const auto& t : tensors) {
    const uint64_t bytes = size_of(t);
    header[t.name] = {{"dtype", t.is_bf16() ? "BF16" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
  l.prefix.assign(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) l.prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  l.prefix += text;
  uint64_t at = l.prefix.size();
  for (const auto& t : tensors) {
    const uint64_t bytes = size_of(t);
    l.ranges.push_back({at, at + bytes, 0});
    at += bytes;
  }
  return l;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const Layout l = layout_of(tensors, metadata);
  write_file_atomic(path, l.pieces(tensors));
}

std::vector<WrittenTensor> write_safetensors_direct(
    const std::string& path, const std::vector<TensorRef>& tensors,
    const std::map<std::string, std::string>& metadata) {
  Layout l = layout_of(tensors, metadata);
  write_file_atomic_direct(
      path, l.pieces(tensors), [&](size_t piece, const char* data, size_t bytes) {
        if (piece > 0) l.ranges[piece - 1].crc32 = crc32(data, bytes, l.ranges[piece - 1].crc32);
      });
  return l.ranges;
}

std::vector<WrittenTensor> write_safetensors_filled(
    const std::string& path, const std::vector<TensorRef>& tensors,
    const std::map<std::string, std::string>& metadata,
    const std::function<void(size_t tensor, uint64_t at, char* dst, size_t n)>& fill) {
  Layout l = layout_of(tensors, metadata);
  std::vector<uint64_t> sizes{l.prefix.size()};
  for (const auto& r : l.ranges) sizes.push_back(r.end - r.begin);
  write_file_atomic_direct_filled(path, sizes, [&](size_t piece, uint64_t at, char* dst, size_t n) {
    if (piece == 0) {
      std::memcpy(dst, l.prefix.data() + at, n);
      return;
    }
    fill(piece - 1, at, dst, n);
    l.ranges[piece - 1].crc32 = crc32(dst, n, l.ranges[piece - 1].crc32);
  });
  return l.ranges;
}

// One tensor's header entry, checked on its own; ranges are checked together.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0, width = 0;
};

namespace {

std::string range_string(uint64_t begin, uint64_t end) {
  std::string s = "[";  // (built with append: GCC 12 warns falsely on "[" + std::string)
  return s.append(std::to_string(begin)).append(", ").append(std::to_string(end)).append("]");
}

// A JSON value for an error message: compact, cut at 60 characters.
std::string brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// The header's JSON (InputError naming `path` for one that is not an object,
// or that names a tensor or an entry's key twice).
nlohmann::json parse_header(const std::string& bytes, uint64_t n, const std::string& path) {
  // nlohmann keeps the last of two equal keys; the parser callback sees every
  // key of every object, so the first repeated one is found here.
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open_objects;
  std::string repeated;
  bool repeated_at_top = false;
  const nlohmann::json::parser_callback_t on_event = [&](int, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      open_objects.pop_back();
    } else if (event == Event::key && repeated.empty() &&
               !open_objects.back().insert(parsed.get<std::string>()).second) {
      repeated = parsed.get<std::string>();
      repeated_at_top = open_objects.size() == 1;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n), on_event);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not a safetensors file (header is not JSON: " + e.what() + ")");
  }
  if (!repeated.empty()) {
    if (repeated_at_top) {
      throw InputError(path + ": tensor " + repeated +
                       ": named twice in the header (expected unique names)");
    }
    throw InputError(path + ": header: key " + repeated +
                     " appears twice in one entry (expected unique keys)");
  }
  if (!header.is_object())
    throw InputError(path + ": not a safetensors file (header is " + brief(header) +
                     ", expected an object)");
  return header;
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& info,
                                                  const std::string& path) {
  if (!info.is_object()) {
    throw InputError(path + ": __metadata__ is " + brief(info) +
                     " (expected an object of strings)");
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [k, v] : info.items()) {
    if (!v.is_string()) {
      throw InputError(path + ": __metadata__: " + k + " is " + brief(v) + " (expected a string)");
    }
    metadata[k] = v.get<std::string>();
  }
  return metadata;
}

// One tensor's entry, checked against the data section's size.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& info,
                             uint64_t data_size, const std::string& path) {
  auto tensor_bad = [&](const std::string& why) {
    return InputError(path + ": tensor " + name + ": " + why);
  };
  if (!info.is_object()) {
    throw tensor_bad("entry is " + brief(info) + " (expected {dtype, shape, data_offsets})");
  }
  SafetensorsEntry e;
  e.name = name;
  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) {
    throw tensor_bad("no dtype string (expected \"F32\" or \"BF16\")");
  }
  const std::string dtype_name = dtype->get<std::string>();
  e.width = dtype_name == "F32" ? 4 : dtype_name == "BF16" ? 2 : 0;
  if (e.width == 0) throw tensor_bad("dtype " + dtype_name + " (expected F32 or BF16)");
  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) {
    throw tensor_bad("no shape (expected a list of dimensions)");
  }
  for (const auto& d : *shape) {
    if (!d.is_number_integer() ||
        (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      throw tensor_bad("shape " + brief(*shape) + ": dimension " + brief(d) +
                       " (expected an integer in 0..2^63-1)");
    }
    if (d.get<int64_t>() < 0) {
      throw tensor_bad("shape " + brief(*shape) + ": dimension " + brief(d) +
                       " is negative (expected >= 0)");
    }
    e.shape.push_back(d.get<int64_t>());
  }
  const int64_t count = tensor::checked_numel(e.shape);
  uint64_t need = 0;
  if (count < 0 || __builtin_mul_overflow(static_cast<uint64_t>(count), e.width, &need)) {
    throw tensor_bad("shape " + brief(*shape) + " of " + dtype_name +
                     " overflows a 64-bit element or byte count (expected a size within the " +
                     std::to_string(data_size) + "-byte data section)");
  }
  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    throw tensor_bad("data_offsets " + (offsets == info.end() ? "missing" : brief(*offsets)) +
                     " (expected [begin, end], two non-negative integers)");
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  const std::string range = "data_offsets " + range_string(e.begin, e.end) + ":";
  if (e.end < e.begin) throw tensor_bad(range + " end before begin (expected begin <= end)");
  if (e.end > data_size) {
    throw tensor_bad(range + " past the end of the data section (expected end <= " +
                     std::to_string(data_size) + ")");
  }
  if (e.end - e.begin != need) {
    throw tensor_bad(range + " " + std::to_string(e.end - e.begin) + " bytes (expected " +
                     std::to_string(need) + " for " + dtype_name + " " + brief(*shape) + ")");
  }
  return e;
}

// Ranges in data order: each starts at or after the end of the one before.
void check_disjoint(const std::vector<SafetensorsEntry>& entries, const std::string& path) {
  std::vector<const SafetensorsEntry*> by_begin;
  for (const auto& e : entries) by_begin.push_back(&e);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
              return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
            });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const SafetensorsEntry& prev = *by_begin[i - 1];
    const SafetensorsEntry& e = *by_begin[i];
    if (e.begin < prev.end) {
      throw InputError(path + ": tensor " + e.name + ": data_offsets " +
                       range_string(e.begin, e.end) + " overlap tensor " + prev.name + "'s " +
                       range_string(prev.begin, prev.end) + " (expected disjoint ranges)");
    }
  }
}

// Reads the tensor's bytes straight from the file (F32 into its floats,
// BF16 through a bounded buffer): a file is never held whole as well.
LoadedTensor load_entry(const SafetensorsEntry& e, std::ifstream& in, uint64_t data_start,
                        const std::string& path) {
  LoadedTensor t;
  t.shape = e.shape;
  const uint64_t count = (e.end - e.begin) / e.width;
  t.data.resize(count);
  if (count == 0) return t;  // a zero-element tensor: data() may be null
  in.seekg(static_cast<std::streamoff>(data_start + e.begin));
  const auto read = [&](char* to, uint64_t n) {
    if (!in.read(to, static_cast<std::streamsize>(n)))
      throw InputError(path + ": tensor " + e.name + ": cannot read its bytes");
  };
  if (e.width == 4) {
    read(reinterpret_cast<char*>(t.data.data()), count * 4);
  } else {
    constexpr uint64_t kChunk = uint64_t{1} << 20;  // elements
    std::vector<uint16_t> half(std::min(count, kChunk));
    for (uint64_t at = 0; at < count; at += kChunk) {
      const uint64_t n = std::min(kChunk, count - at);
      read(reinterpret_cast<char*>(half.data()), n * 2);
      for (uint64_t i = 0; i < n; ++i) t.data[at + i] = to_float(bf16{half[i]});
    }
  }
  return t;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(path + ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading (" + std::strerror(errno) + ")");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  auto bad = [&](const std::string& why) {
    return InputError(path + ": not a safetensors file (" + why + ")");
  };
  if (size < 8) throw bad("shorter than its 8-byte header length");
  std::string bytes(8, '\0');
  if (!in.read(bytes.data(), 8)) throw InputError(path + ": cannot read its header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > size - 8) throw bad("header length " + std::to_string(n) + " past the end");
  bytes.resize(8 + n);  // the header only; the tensors are read one by one
  if (!in.read(bytes.data() + 8, static_cast<std::streamsize>(n)))
    throw InputError(path + ": cannot read its header");
  const nlohmann::json header = parse_header(bytes, n, path);
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = parse_metadata(info, path);
    } else {
      entries.push_back(parse_entry(name, info, data_size, path));
    }
  }
  check_disjoint(entries, path);
  for (auto& e : entries) {
    shapes_.emplace(e.name, e.shape);
    std::string name = e.name;
    entries_.emplace(std::move(name), std::make_shared<const SafetensorsEntry>(std::move(e)));
  }
}

LoadedTensor SafetensorsReader::read(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw InputError(path_ + ": tensor " + name + ": absent");
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw InputError(path_ + ": cannot open for reading (" + std::strerror(errno) + ")");
  return load_entry(*it->second, in, data_start_, path_);
}

SafetensorsFile read_safetensors(const std::string& path) {
  const SafetensorsReader reader(path);
  SafetensorsFile file;
  file.path = path;
  file.metadata = reader.metadata();
  for (const auto& [name, shape] : reader.shapes()) file.tensors.emplace(name, reader.read(name));
  return file;
}

const LoadedTensor& SafetensorsFile::get(const std::string& name,
                                         const std::vector<int64_t>& shape) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) throw InputError(path + ": tensor " + name + ": absent");
  if (it->second.shape != shape) {
    throw InputError(path + ": tensor " + name + ": shape " +
                     tensor::shape_string(it->second.shape) + " (expected " +
                     tensor::shape_string(shape) + ")");
  }
  return it->second;
}

}  // namespace anvil::ckpt
