#include "anvil/ckpt/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/ckpt/safetensors.hpp"

namespace anvil::ckpt {
namespace fs = std::filesystem;
namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// The step-N checkpoint directories of a run, oldest step first (by number:
// names outgrow their 8 digits past step 99999999).
std::vector<fs::path> step_dirs(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
    int64_t step = 0;
    const char* end = n.data() + n.size();
    const auto [last, err] = std::from_chars(n.data() + 5, end, step);
    if (err == std::errc() && last == end && n.size() > 5) found.emplace_back(step, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

}  // namespace

std::vector<std::string> checkpoint_dirs(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const auto& d : step_dirs(run_dir)) out.push_back(d.string());
  return out;
}

std::string checkpoint_name(int64_t step) {
  return step_name(step);
}

void remove_checkpoint(const std::string& dir) {
  // Renamed away first (atomic), then deleted: a crash mid-delete leaves no
  // half-deleted step-N directory behind.
  std::error_code ec;
  std::string name = ".";  // (append: GCC 12 warns falsely on "." + std::string)
  name.append(fs::path(dir).filename().string()).append(".tmp-deleting");
  const fs::path trash = fs::path(dir).parent_path() / name;
  fs::rename(dir, trash, ec);
  fs::remove_all(ec ? fs::path(dir) : trash, ec);
}

void prune_checkpoints(const std::string& run_dir, int keep, const std::string& newest) {
  const auto dirs = step_dirs(run_dir);
  if (keep > 0 && static_cast<int>(dirs.size()) > keep) {
    for (size_t i = 0; i + keep < dirs.size(); ++i) {
      if (dirs[i].filename() == fs::path(newest).filename()) continue;
      remove_checkpoint(dirs[i].string());
    }
  }
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::exists(p / "state.json") || fs::exists(p / "index.json")) return p.string();
  if (!fs::is_directory(p)) {
    throw InputError(path +
                     ": not a checkpoint or run directory (expected a directory holding "
                     "state.json or step-* checkpoints)");
  }
  const auto dirs = step_dirs(p);
  if (dirs.empty()) throw InputError(path + ": holds no step-* checkpoint");
  return dirs.back().string();
}

std::string tokenizer_model(const std::string& checkpoint_dir) {
  for (const fs::path& p : {fs::path(checkpoint_dir) / kTokenizerFile,
                            fs::path(checkpoint_dir).parent_path() / kTokenizerFile})
    if (fs::is_regular_file(p)) return p.string();
  return "";
}

std::string read_state_json(const std::string& checkpoint_dir) {
  return read_file((fs::path(checkpoint_dir) / "state.json").string());
}

nlohmann::json read_state(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / "state.json").string();
  const nlohmann::json s = parse_json_unique(read_file(path), path);
  auto bad = [&](const std::string& why) { return InputError(path + ": " + why); };
  if (!s.is_object()) {
    throw bad("a JSON " + std::string(s.type_name()) + " (expected an anvil-train-state object)");
  }
  auto field = [&](const char* key, bool (*ok)(const nlohmann::json&), const char* expected,
                   bool required) {
    const auto it = s.find(key);
    if (it == s.end()) {
      if (required) throw bad(std::string("no ") + key + " (expected " + expected + ")");
      return;
    }
    if (!ok(*it)) {
      std::string value = it->dump();
      if (value.size() > 60) value = value.substr(0, 57) + "...";
      throw bad(std::string(key) + " is " + value + " (expected " + expected + ")");
    }
  };
  auto is_string = [](const nlohmann::json& v) { return v.is_string(); };
  auto is_object = [](const nlohmann::json& v) { return v.is_object(); };
  auto is_count = [](const nlohmann::json& v) { return v.is_number_unsigned(); };
  auto is_step = [](const nlohmann::json& v) {
    return v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  };
  auto is_positive = [](const nlohmann::json& v) {
    return v.is_number_unsigned() && v.get<uint64_t>() >= 1 &&
           v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  };
  auto is_format = [](const nlohmann::json& v) { return v == "anvil-train-state"; };
  field("format", is_format, "\"anvil-train-state\"", true);
  field("step", is_step, "an integer >= 0", true);
  field("config", is_object, "the model config object", true);
  field("seed", is_count, "an integer >= 0", true);
  for (const char* key : {"batch", "seq", "accum"}) {
    field(key, is_positive, "an integer >= 1", true);
  }
  for (const char* key : {"precision", "optimizer", "data", "tokenizer"}) {
    field(key, is_string, "a string", false);
  }
  auto is_device = [](const nlohmann::json& v) { return v == "cpu" || v == "cuda"; };
  field("device", is_device, "\"cpu\" or \"cuda\"", false);
  return s;
}


}  // namespace anvil::ckpt
