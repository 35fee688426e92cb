#include "anvil/ckpt/safetensors.hpp"

#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "anvil/base/bf16.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/tensor/tensor.hpp"

namespace anvil::ckpt {

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  std::vector<std::string_view> pieces;
  pieces.reserve(tensors.size() + 2);
  for (const auto& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(tensor::numel(t.shape)) * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
  std::string prefix(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  prefix += text;
  pieces.emplace_back(prefix);
  for (const auto& t : tensors) {
    pieces.emplace_back(reinterpret_cast<const char*>(t.data),
                        static_cast<size_t>(tensor::numel(t.shape)) * sizeof(float));
  }
  write_file_atomic(path, pieces);
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  auto bad = [&](const std::string& why) {
    return InputError(path + ": not a safetensors file (" + why + ")");
  };
  if (bytes.size() < 8) throw bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) throw bad("header length " + std::to_string(n) + " past the end");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const nlohmann::json::parse_error& e) {
    throw bad(std::string("header is not JSON: ") + e.what());
  }
  const size_t data_start = 8 + n;
  const size_t data_size = bytes.size() - data_start;
  SafetensorsFile file;
  file.path = path;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : info.items()) file.metadata[k] = v.get<std::string>();
      continue;
    }
    try {
      const std::string dtype = info.at("dtype").get<std::string>();
      LoadedTensor t;
      t.shape = info.at("shape").get<std::vector<int64_t>>();
      const auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
      const auto count = static_cast<uint64_t>(tensor::numel(t.shape));
      const uint64_t width = dtype == "F32" ? 4 : dtype == "BF16" ? 2 : 0;
      if (width == 0) throw bad(name + ": dtype " + dtype + " (expected F32 or BF16)");
      if (offs.size() != 2 || offs[1] < offs[0] || offs[1] > data_size ||
          offs[1] - offs[0] != count * width) {
        throw bad(name + ": data_offsets do not match its shape");
      }
      t.data.resize(count);
      const char* src = bytes.data() + data_start + offs[0];
      if (width == 4) {
        std::memcpy(t.data.data(), src, count * 4);
      } else {
        for (uint64_t i = 0; i < count; ++i) {
          bf16 h;
          std::memcpy(&h.bits, src + 2 * i, 2);
          t.data[i] = to_float(h);
        }
      }
      file.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw bad(name + ": " + e.what());
    }
  }
  return file;
}

const LoadedTensor& SafetensorsFile::get(const std::string& name,
                                         const std::vector<int64_t>& shape) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) throw InputError(path + ": no tensor named " + name);
  if (it->second.shape != shape) {
    throw InputError(path + ": " + name + " has shape " + tensor::shape_string(it->second.shape) +
                     ", expected " + tensor::shape_string(shape));
  }
  return it->second;
}

}  // namespace anvil::ckpt
