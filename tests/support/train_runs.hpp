// Training runs of the anvil binary for the distributed tests: `anvil
// train` on N processes under mpirun (oversubscribed, one thread each) on a
// small generated corpus, its summary, final weights and per-step router
// loads, and the comparison of two runs' trajectories.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/base/files.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"

namespace anvil::test_support {

struct TrainRun {
  std::vector<double> losses;
  // Per step, every MoE layer's tokens per class (metrics.jsonl; empty
  // for a model without experts): the routing choices.
  std::vector<std::vector<int64_t>> router_loads;
  anvil::ckpt::SafetensorsFile weights;
  double val_loss = 0;
  int64_t optimizer_bytes = 0;
  bool optimizer_on_device = false;  // the step ran on the model's device
  int64_t parameter_bytes = 0;
  std::string checkpoint;
};

// Removed when the test binary exits.
struct ScratchDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("anvil-dp-" + std::to_string(::getpid()));
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline std::filesystem::path work_dir() {
  static const ScratchDir scratch;
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = scratch.path;
    std::filesystem::create_directories(d);
    // Words drawn from a small vocabulary with a skewed distribution: a
    // corpus with structure to learn, made here (no download).
    std::mt19937 gen(7);
    const std::vector<std::string> words = {"the", "and", "of",   "to",  "in",  "that", "he", "was",
                                            "for", "it",  "with", "as",  "his", "on",   "be", "at",
                                            "by",  "had", "not",  "are", "but", "from", "or"};
    std::geometric_distribution<int> pick(0.18);
    std::string text;
    while (text.size() < 60000) {
      text += words[static_cast<size_t>(pick(gen)) % words.size()];
      text += gen() % 9 == 0 ? ".\n" : " ";
    }
    anvil::write_file_atomic((d / "text.txt").string(), text);
    return d;
  }();
  return dir;
}

// `anvil train` on `ranks` processes (1: no mpirun at all) with `args`.
inline TrainRun train(int ranks, const std::string& name, const std::string& args) {
  const std::filesystem::path dir = work_dir();
  const std::filesystem::path out = dir / name;
  std::filesystem::remove_all(out);
  const std::string launcher = ranks == 1 ? std::string()
                                          : std::string(ANVIL_MPIRUN) +
                                                " --allow-run-as-root --oversubscribe -np " +
                                                std::to_string(ranks) + " ";
  const std::string cmd = "OMP_NUM_THREADS=1 timeout 300 " + launcher + ANVIL_BINARY +
                          " train --data " + (dir / "text.txt").string() + " --out " +
                          out.string() + " --json-out " + (out.string() + ".json") +
                          " --peak-gflops 1 --log-every 1000 " + args + " > " + out.string() +
                          ".log 2>&1";
  const int st = std::system(cmd.c_str());
  TrainRun r;
  const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  EXPECT_TRUE(ok) << cmd << "\n" << anvil::read_file(out.string() + ".log");
  if (!ok) return r;
  const auto j = nlohmann::json::parse(anvil::read_file(out.string() + ".json"));
  r.losses = j.at("losses").get<std::vector<double>>();
  r.val_loss = j.at("val_loss").is_null() ? -1.0 : j.at("val_loss").get<double>();
  r.optimizer_bytes = j.at("optimizer_bytes").get<int64_t>();
  r.optimizer_on_device = j.at("optimizer_on_device").get<bool>();
  r.parameter_bytes = j.at("parameter_bytes").get<int64_t>();
  r.checkpoint = j.at("checkpoint").get<std::string>();
  r.weights.tensors = anvil::ckpt::read_tensors(r.checkpoint, "model");
  std::istringstream lines(anvil::read_file((out / "metrics.jsonl").string()));
  for (std::string line; std::getline(lines, line);) {
    const auto m = nlohmann::json::parse(line);
    if (!m.contains("router")) continue;
    std::vector<int64_t> loads;
    for (const auto& layer : m.at("router"))
      for (const auto& n : layer.at("load")) loads.push_back(n.get<int64_t>());
    r.router_loads.push_back(loads);
  }
  return r;
}

// Largest |a - b| over a tensor, relative to the reference's largest entry.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// ||a - b|| / ||b|| over a tensor (2-norms).
inline double relative_norm_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 1e-24;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

// Losses within `tol`; every weight tensor within `norm_tol` relative in
// norm (||w - w_ref|| / ||w_ref||), and each entry within `weight_tol` of
// the tensor's largest entry. fp32 sums the ranks' partial gradients in another order than one
// GEMM over all rows (~1e-7 relative), and AdamW divides each update by the
// root of its second moment, so gradient entries near zero carry that
// rounding into the weights at full size: after 20 steps the weights differ
// by a few 1e-6 (measured up to 7.7e-6 of a tensor's largest entry, and
// up to 5.3e-6 in norm for zaya-tiny under Muon, whose Newton-Schulz
// normalises small differences up too) while every loss agrees to ~1e-7.
// Only a reduction order independent of the rank count would close that
// gap: a 1-rank GEMM over all rows cannot sum in a 4-rank tree's order.
// Attention's key bias gets an exactly-zero gradient (softmax ignores a
// shift shared by all keys), so its value is rounding noise scaled by AdamW
// in every run, and is not compared.
inline void expect_same_trajectory(const TrainRun& got, const TrainRun& want, double tol,
                            const std::string& what, double weight_tol = 2e-5,
                            double norm_tol = 5e-6) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_LE(std::abs(got.losses[s] - want.losses[s]), tol * std::abs(want.losses[s]))
        << what << ": loss of step " << s + 1 << " " << got.losses[s] << " vs " << want.losses[s];
  }
  EXPECT_LE(std::abs(got.val_loss - want.val_loss), tol * std::abs(want.val_loss)) << what;
  ASSERT_EQ(got.weights.tensors.size(), want.weights.tensors.size()) << what;
  double worst = 0, worst_norm = 0;
  std::string worst_name, worst_norm_name;
  for (const auto& [name, t] : want.weights.tensors) {
    const auto it = got.weights.tensors.find(name);
    ASSERT_NE(it, got.weights.tensors.end()) << what << ": no " << name;
    if (name.ends_with("k_proj.bias")) continue;
    const double d = relative_difference(it->second.data, t.data);
    EXPECT_LE(d, weight_tol) << what << ": " << name;
    const double dn = relative_norm_difference(it->second.data, t.data);
    EXPECT_LE(dn, norm_tol) << what << ": " << name << " (norm)";
    if (d > worst) {
      worst = d;
      worst_name = name;
    }
    if (dn > worst_norm) {
      worst_norm = dn;
      worst_norm_name = name;
    }
  }
  std::printf(
      "%s: weights within %.2e in norm (%s), largest entry difference %.2e of the "
      "tensor's largest (%s)\n",
      what.c_str(), worst_norm, worst_norm_name.c_str(), worst, worst_name.c_str());
}

}  // namespace anvil::test_support
