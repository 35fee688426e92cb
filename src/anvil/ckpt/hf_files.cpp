// Reading and writing transformers' single-file and sharded safetensors
// checkpoints, and the atomic export directory.
#include "anvil/ckpt/hf_files.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "anvil/base/error.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/progress.hpp"

namespace anvil::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t HfOutTensor::bytes(bool bf16) const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n * (bf16 ? 2 : 4);
}

int64_t write_hf_weights(
    const fs::path& dir, const std::vector<HfOutTensor>& out, int64_t max_bytes, bool bf16,
    const std::function<void(size_t tensor, uint64_t at, char* dst, size_t n)>& fill) {
  std::vector<std::vector<size_t>> files(1);  // indexes into `out`
  int64_t in_file = 0, total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t bytes = out[i].bytes(bf16);
    if (in_file > 0 && in_file + bytes > max_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(i);
    in_file += bytes;
    total += bytes;
  }
  json weight_map = json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
    const std::string file = files.size() == 1 ? "model.safetensors" : name;
    std::vector<TensorRef> refs;
    for (const size_t i : files[f]) {
      refs.push_back({out[i].name, out[i].shape, nullptr, nullptr, bf16});
      weight_map[out[i].name] = file;
    }
    progress_line(true, f, files.size(), "writing " + file);
    write_safetensors_filled(
        (dir / file).string(), refs, {{"format", "pt"}},
        [&](size_t k, uint64_t at, char* dst, size_t n) { fill(files[f][k], at, dst, n); });
  }
  progress_line(true, files.size(), files.size(), "");
  if (files.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  return static_cast<int64_t>(files.size());
}

HfWeights::HfWeights(const fs::path& dir) {
  std::vector<std::string> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = parse_json_unique(read_file(index.string()), index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw InputError(index.string() + ": no weight_map object");
    std::set<std::string> names;
    for (const auto& [k, v] : j["weight_map"].items()) {
      if (!v.is_string() || v.get<std::string>().find('/') != std::string::npos)
        throw InputError(index.string() + ": weight_map." + k + " is not a file name");
      names.insert(v.get<std::string>());
    }
    files.assign(names.begin(), names.end());
  } else {
    files = {"model.safetensors"};
  }
  files_.reserve(files.size());
  for (const std::string& name : files) {
    const SafetensorsReader& f = files_.emplace_back((dir / name).string());
    for (const auto& [tensor, shape] : f.shapes()) {
      const auto [it, added] = file_of_.emplace(tensor, files_.size() - 1);
      if (!added)
        throw InputError(f.path() + ": tensor " + tensor + " is in " + files_[it->second].path() +
                         " too (expected each tensor in one file)");
      shapes_.emplace(tensor, shape);
    }
  }
}

LoadedTensor HfWeights::read(const std::string& name) const {
  const auto it = file_of_.find(name);
  if (it == file_of_.end()) throw InputError("no tensor " + name + " in the checkpoint's files");
  return files_[it->second].read(name);
}

void write_directory(const fs::path& target, const std::function<void(const fs::path&)>& fill) {
  std::string prefix = ".";  // (append: GCC 12 warns falsely on "." + std::string)
  prefix.append(target.filename().string()).append(".tmp-");
  const fs::path tmp = target.parent_path() / (prefix + std::to_string(::getpid()));
  std::error_code ec;
  // Another writer's temporary whose process is gone (killed, interrupted)
  // is left over: removed. A live one's is not touched.
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const long p = std::strtol(pid.c_str(), nullptr, 10);
    if (p > 0 && ::kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), ec);
  }
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw SystemError(tmp.string() + ": cannot create directory: " + ec.message());
  try {
    fill(tmp);
    fsync_directory(tmp.string());
    fs::rename(tmp, target, ec);
    if (ec) throw SystemError(target.string() + ": cannot rename into place: " + ec.message());
    fsync_directory(target.parent_path().string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace anvil::ckpt
