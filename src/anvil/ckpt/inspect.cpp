#include "anvil/ckpt/inspect.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/model_tensors.hpp"

namespace anvil::ckpt {

std::vector<VerifyReport> verify_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (fs::exists(fs::path(path) / "state.json") || fs::exists(fs::path(path) / "index.json")) {
    dirs.push_back(path);
  } else {
    resolve_checkpoint(path);  // names the path when it holds none
    dirs = checkpoint_dirs(path);
  }
  std::vector<VerifyReport> reports;
  for (const auto& d : dirs) {
    reports.push_back(verify_checkpoint(d, model_tensor_problems));
    reports.back().dir = d;
  }
  return reports;
}

Table verify_table(const std::vector<VerifyReport>& reports) {
  Table t({"checkpoint", "format", "tensors", "shards", "bytes", "status"});
  for (const auto& r : reports) {
    // Appended, not "v" + to_string(...): GCC 12 reports a false
    // -Wstringop-overflow on that form once the string header is precompiled.
    std::string format = "v";
    format += std::to_string(r.version);
    t.add_row({r.dir, format, std::to_string(r.tensors),
               std::to_string(r.shards), human_bytes(static_cast<double>(r.bytes)),
               r.problems.empty() ? "intact" : r.problems.front()});
  }
  return t;
}

nlohmann::json verify_json(const std::vector<VerifyReport>& reports) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : reports)
    j.push_back({{"checkpoint", r.dir},
                 {"version", r.version},
                 {"tensors", r.tensors},
                 {"shards", r.shards},
                 {"bytes", r.bytes},
                 {"layout", r.layout},
                 {"problems", r.problems}});
  return j;
}

namespace {

std::string number_3g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Infinite where one side is NaN or infinite and the other is not the same
// (std::max would drop a NaN and call the tensors equal).
double max_abs_difference(const LoadedTensor& x, const LoadedTensor& y) {
  double d = 0;
  for (size_t i = 0; i < x.data.size(); ++i) {
    const double a = x.data[i], b = y.data[i];
    if (a == b || (std::isnan(a) && std::isnan(b))) continue;
    const double diff = std::abs(a - b);
    d = std::isfinite(diff) ? std::max(d, diff) : INFINITY;
  }
  return d;
}

}  // namespace

DiffReport diff_checkpoints(const std::string& a_path, const std::string& b_path) {
  DiffReport r;
  r.a = resolve_checkpoint(a_path);
  r.b = resolve_checkpoint(b_path);
  // The tensors in both are read in batches of about kBatchBytes from
  // each side: memory stays two batches whatever the checkpoints' size, and
  // a tensor on one side only is known from the index without reading it.
  constexpr uint64_t kBatchBytes = uint64_t{256} << 20;
  for (const char* kind : {"model", "optimizer"}) {
    const bool optimizer = std::strcmp(kind, "optimizer") == 0;
    const auto sa = tensor_shapes(r.a, kind), sb = tensor_shapes(r.b, kind);
    std::vector<std::string> both;
    for (const auto& [name, shape] : sa) {
      const auto it = sb.find(name);
      if (it == sb.end() && optimizer)
        ++r.optimizer_only_a;
      else if (it == sb.end() || it->second != shape)
        r.only_a.push_back(name);
      else
        both.push_back(name);
    }
    for (const auto& [name, shape] : sb) {
      if (sa.count(name)) continue;
      if (optimizer)
        ++r.optimizer_only_b;
      else
        r.only_b.push_back(name);
    }
    for (size_t next = 0; next < both.size();) {
      std::set<std::string> batch;
      uint64_t bytes = 0;
      for (; next < both.size() && (batch.empty() || bytes < kBatchBytes); ++next) {
        uint64_t n = sizeof(float);
        for (const int64_t d : sa.at(both[next])) n *= static_cast<uint64_t>(d);
        bytes += n;
        batch.insert(both[next]);
      }
      const auto ta = read_tensors(r.a, kind, &batch), tb = read_tensors(r.b, kind, &batch);
      for (const auto& [name, t] : ta) {
        const LoadedTensor& u = tb.at(name);
        ++r.compared;
        if (std::memcmp(t.data.data(), u.data.data(), t.data.size() * sizeof(float)) == 0)
          ++r.identical;
        else
          r.different.push_back({name, max_abs_difference(t, u)});
      }
    }
  }
  return r;
}

nlohmann::json DiffReport::to_json() const {
  nlohmann::json differ = nlohmann::json::array();
  for (const auto& d : different) differ.push_back({{"name", d.name}, {"max_abs", d.max_abs}});
  return {{"a", a},
          {"b", b},
          {"same", same()},
          {"compared", compared},
          {"identical", identical},
          {"different", differ},
          {"only_a", only_a},
          {"only_b", only_b},
          {"optimizer_only_a", optimizer_only_a},
          {"optimizer_only_b", optimizer_only_b}};
}

std::string DiffReport::text() const {
  std::string s;
  for (const auto& n : only_a) s += n + ": only in " + a + " (or another shape)\n";
  for (const auto& n : only_b) s += n + ": only in " + b + "\n";
  auto worst = std::max_element(different.begin(), different.end(),
                                [](const auto& x, const auto& y) { return x.max_abs < y.max_abs; });
  if (same()) {
    s += "identical: " + std::to_string(compared) + " tensors, the same bytes (" + a + ", " + b +
         ")\n";
  } else if (!different.empty()) {
    s += std::to_string(different.size()) + " of " + std::to_string(compared) +
         " tensors in both differ; the largest difference is " + number_3g(worst->max_abs) +
         " in " + worst->name + "\n";
  } else {
    s += std::to_string(only_a.size() + only_b.size()) +
         " weight tensors are on one side only; the " + std::to_string(compared) +
         " tensors in both have the same bytes\n";
  }
  if (optimizer_only_a > 0)
    s += "optimizer state only in " + a + " (" + std::to_string(optimizer_only_a) +
         " tensors): not compared\n";
  if (optimizer_only_b > 0)
    s += "optimizer state only in " + b + " (" + std::to_string(optimizer_only_b) +
         " tensors): not compared\n";
  return s;
}

}  // namespace anvil::ckpt
