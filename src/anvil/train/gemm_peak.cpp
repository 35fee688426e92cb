#include "anvil/train/gemm_peak.hpp"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/bench/measure.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/plan/hw_profile.hpp"

namespace anvil::train {
namespace {

using json = nlohmann::json;

std::string cache_path() {
  if (const char* d = std::getenv("ANVIL_CACHE_DIR"); d && *d)
    return std::string(d) + "/gemm-peak.json";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return std::string(d) + "/anvil/gemm-peak.json";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/anvil/gemm-peak.json";
  return "";
}

// What the rate depends on: the CPU, the kernels it runs, dtype and threads.
std::string cache_key(model::Precision precision) {
  const CpuInfo& cpu = cpu_info();
  std::string key = cpu.vendor;
  for (const std::string& part : {std::to_string(cpu.family), std::to_string(cpu.model),
                                  device::blas_info().corename, model::to_string(precision)})
    key.append("-").append(part);
  if (precision == model::Precision::bf16)
    key.append(device::bf16_path() == device::Bf16Path::native ? "-native" : "-emulated");
  return key.append("-").append(std::to_string(num_threads())).append("threads");
}

std::string today() {
  char buf[16];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace

double measure_gemm_gflops(model::Precision precision, int64_t n, double min_seconds) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<bf16> a16(precision == model::Precision::bf16 ? n * n : 0, to_bf16(0.5f));
  std::vector<bf16> b16(a16.size(), to_bf16(0.25f));
  bench::TimingPolicy policy;
  policy.min_seconds = min_seconds;
  const bench::Samples s = bench::time_calls(
      [&] {
        if (precision == model::Precision::bf16) {
          device::gemm(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(),
                       n);
        } else {
          device::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        }
      },
      policy);
  return 2.0 * static_cast<double>(n * n * n) / s.median() / 1e9;
}

GemmPeak gemm_peak(double given, const std::string& hw_profile, model::Precision precision) {
  if (given > 0) return {given, "given"};
  const std::string dtype = precision == model::Precision::bf16 ? "bf16" : "f32";
  if (!hw_profile.empty()) {
    const plan::HwProfile p = plan::load_hw_profile(hw_profile);
    for (const auto& peak : p.peak)
      if (peak.dtype == dtype && peak.threads == num_threads())
        return {peak.gflops, "measured peak in " + hw_profile};
    throw InputError("metrics.hw_profile: " + hw_profile + " has no " + dtype + " GEMM peak at " +
                     std::to_string(num_threads()) +
                     " threads (expected a profile from anvil hw "
                     "--profile on this machine)");
  }
  const std::string path = cache_path(), key = cache_key(precision);
  json cache = json::object();
  if (!path.empty() && std::filesystem::exists(path)) {
    cache = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
    if (!cache.is_object()) cache = json::object();
    const auto hit = cache.find(key);
    if (hit != cache.end() && hit->is_object() && hit->value("gflops", 0.0) > 0)
      return {hit->value("gflops", 0.0), "measured " + hit->value("date", std::string("?")) +
                                             " (1 s of 2048^3 GEMMs), cached in " + path};
  }
  const double gflops = measure_gemm_gflops(precision, 2048, 1.0);
  cache[key] = {{"gflops", gflops}, {"date", today()}};
  std::string where = "measured now (1 s of 2048^3 GEMMs)";
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomic(path, cache.dump(2) + "\n");
    where += ", cached in " + path;
  } catch (const std::exception&) {
    // A cache that cannot be written only costs the next run a measurement.
  }
  return {gflops, where};
}

}  // namespace anvil::train
