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

std::string save_checkpoint(const std::string& run_dir, int64_t step, const CheckpointData& d,
                            int keep) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw SystemError(run_dir + ": cannot create directory: " + ec.message());
  const fs::path final_dir = fs::path(run_dir) / step_name(step);
  char tmp_name[64];
  std::snprintf(tmp_name, sizeof tmp_name, ".step-%08lld.tmp-%d", static_cast<long long>(step),
                static_cast<int>(::getpid()));
  const fs::path tmp_dir = fs::path(run_dir) / tmp_name;
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec) throw SystemError(tmp_dir.string() + ": cannot create directory: " + ec.message());
  try {
    std::vector<TensorRef> weights, moments;
    for (const auto& s : d.registry->specs()) {
      weights.push_back({s.name, s.shape, d.params + s.offset});
      if (d.exp_avg != nullptr) {
        moments.push_back({s.name + ".exp_avg", s.shape, d.exp_avg + s.offset});
        moments.push_back({s.name + ".exp_avg_sq", s.shape, d.exp_avg_sq + s.offset});
      }
      if (d.momentum != nullptr && s.group == model::OptimizerGroup::muon) {
        moments.push_back({s.name + ".momentum_buffer", s.shape, d.momentum + s.offset});
      }
    }
    for (const auto& e : d.extra) {
      (e.optimizer_state ? moments : weights).push_back({e.name, e.shape, e.data});
    }
    const std::map<std::string, std::string> meta = {{"format", "anvil-checkpoint"},
                                                     {"version", "1"}};
    write_safetensors((tmp_dir / "model.safetensors").string(), weights, meta);
    if (!moments.empty()) {
      write_safetensors((tmp_dir / "optimizer.safetensors").string(), moments, meta);
    }
    write_file_atomic((tmp_dir / "state.json").string(), d.state_json);
    fsync_directory(tmp_dir.string());
    fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an earlier run
    fs::rename(tmp_dir, final_dir);
    fsync_directory(run_dir);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  const auto dirs = step_dirs(run_dir);
  if (keep > 0 && static_cast<int>(dirs.size()) > keep) {
    for (size_t i = 0; i + keep < dirs.size(); ++i) {
      if (dirs[i].filename() != final_dir.filename()) fs::remove_all(dirs[i], ec);
    }
  }
  return final_dir.string();
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::exists(p / "state.json")) return p.string();
  if (!fs::is_directory(p)) {
    throw InputError(path +
                     ": not a checkpoint or run directory (expected a directory holding "
                     "state.json or step-* checkpoints)");
  }
  const auto dirs = step_dirs(p);
  if (dirs.empty()) throw InputError(path + ": holds no step-* checkpoint");
  return dirs.back().string();
}

std::string read_state_json(const std::string& checkpoint_dir) {
  return read_file((fs::path(checkpoint_dir) / "state.json").string());
}

nlohmann::json read_state(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / "state.json").string();
  nlohmann::json s;
  try {
    s = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
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
  return s;
}

void load_checkpoint(const std::string& dir, const model::ParamRegistry& registry, float* params,
                     float* exp_avg, float* exp_avg_sq, float* momentum,
                     const std::vector<model::ExtraTensor>& extra) {
  auto load_extra = [&](const SafetensorsFile& file, bool optimizer_state) {
    for (const auto& e : extra) {
      if (e.optimizer_state != optimizer_state) continue;
      const auto& t = file.get(e.name, e.shape);
      std::memcpy(e.data, t.data.data(), t.data.size() * sizeof(float));
    }
  };
  {
    const auto w = read_safetensors((fs::path(dir) / "model.safetensors").string());
    for (const auto& s : registry.specs()) {
      const auto& t = w.get(s.name, s.shape);
      std::memcpy(params + s.offset, t.data.data(), t.data.size() * sizeof(float));
    }
    load_extra(w, false);
  }
  if (exp_avg == nullptr) return;
  const auto o = read_safetensors((fs::path(dir) / "optimizer.safetensors").string());
  for (const auto& s : registry.specs()) {
    const auto& m = o.get(s.name + ".exp_avg", s.shape);
    const auto& v = o.get(s.name + ".exp_avg_sq", s.shape);
    std::memcpy(exp_avg + s.offset, m.data.data(), m.data.size() * sizeof(float));
    std::memcpy(exp_avg_sq + s.offset, v.data.data(), v.data.size() * sizeof(float));
    if (momentum != nullptr && s.group == model::OptimizerGroup::muon) {
      const auto& b = o.get(s.name + ".momentum_buffer", s.shape);
      std::memcpy(momentum + s.offset, b.data.data(), b.data.size() * sizeof(float));
    }
  }
  load_extra(o, true);
}

}  // namespace anvil::ckpt
