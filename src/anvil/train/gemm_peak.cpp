#include "anvil/train/gemm_peak.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/clock.hpp"
#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/table.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/bench/measure.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/device/gemm_engine.hpp"
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
}  // namespace

std::string gemm_peak_cache_key(model::Precision precision) {
  const CpuInfo& cpu = cpu_info();
  std::string key = cpu.vendor;
  for (const std::string& part : {std::to_string(cpu.family), std::to_string(cpu.model),
                                  device::blas_info().corename, model::to_string(precision)})
    key.append("-").append(part);
  if (precision == model::Precision::bf16)
    key.append(device::bf16_path() == device::Bf16Path::native ? "-native" : "-emulated");
  return key.append("-").append(std::to_string(num_threads())).append("threads");
}

namespace {

// n^3 GEMMs in `precision` timed for `min_seconds`: the median call's and
// the fastest call's GFLOP/s.
std::pair<double, double> measure_gemm_gflops(model::Precision precision, int64_t n,
                                              double min_seconds) {
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
  const double flops = 2.0 * static_cast<double>(n * n * n);
  return {flops / s.median() / 1e9, flops / s.best() / 1e9};
}

// The 1-minute load average (0 where /proc/loadavg cannot be read).
double load_average() {
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  return load;
}

json read_cache(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return json::object();
  json cache = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  return cache.is_object() ? cache : json::object();
}

// Writes the cache; one that cannot be written only costs the next run a measurement.
bool write_cache(const std::string& path, const json& cache) {
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomic(path, cache.dump(2) + "\n");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void forget_cached_peak(model::Precision precision) {
  const std::string path = cache_path();
  json cache = read_cache(path);
  if (cache.erase(gemm_peak_cache_key(precision)) > 0) write_cache(path, cache);
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
  const std::string path = cache_path(), key = gemm_peak_cache_key(precision);
  json cache = read_cache(path);
  const auto hit = cache.find(key);
  if (hit != cache.end() && hit->is_object() && hit->value("gflops", 0.0) > 0)
    return {hit->value("gflops", 0.0),
            "measured " + hit->value("date", std::string("?")) +
                " (1 s of 2048^3 GEMMs), cached in " + path,
            true};
  const double load = load_average();
  const auto [median, best] = measure_gemm_gflops(precision, 2048, 1.0);
  std::string where = "measured now (1 s of 2048^3 GEMMs)";
  const bool idle = load < 0.5 * cpu_info().logical_cpus && median >= 0.9 * best;
  if (!idle) {
    where += "; not cached: the machine was busy (load " + fmt(load, 1) + ")";
  } else {
    cache[key] = {{"gflops", median}, {"date", today_utc()}};
    if (!path.empty() && write_cache(path, cache)) where += ", cached in " + path;
  }
  return {median, where, false};
}

GemmPeak device_gemm_peak(double given, device::DeviceKind kind, Dtype type) {
  if (given > 0) return {given, "given"};
  constexpr int64_t n = 4096;
  constexpr int kWarm = 3, kTimed = 20;
  auto engine = device::make_gemm_engine(kind);
  device::Stream stream(kind);
  device::ArenaPlan plan;
  for (int i = 0; i < 3; ++i) plan.add(static_cast<size_t>(n * n) * sizeof(float));
  device::DeviceArena arena(kind, "GEMM peak operands", plan);
  float* a = arena.take<float>(n * n);
  float* b = arena.take<float>(n * n);
  float* c = arena.take<float>(n * n);
  // Random operands in the type's own encoding: a GPU draws less power on
  // constant data, and a power-capped one would then show a peak training
  // does not reach.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(n * n));
  for (float* dst : {a, b}) {
    for (float& v : values) v = u(rng);
    device::upload(device::encode(values, type), dst, stream);
  }
  device::GemmDesc d;
  d.m = d.n = d.k = n;
  d.type = type;
  std::vector<double> ms;
  device::Event start(kind), stop(kind);
  for (int i = 0; i < kWarm + kTimed; ++i) {
    start.record(stream);
    engine->run(d, a, b, c, nullptr, stream);
    stop.record(stream);
    stop.synchronize();
    if (i >= kWarm) ms.push_back(device::Event::elapsed_ms(start, stop));
  }
  std::sort(ms.begin(), ms.end());
  const double gflops = d.flops() / (ms[ms.size() / 2] * 1e-3) / 1e9;
  return {gflops, "measured now (" + to_string(type) + " 4096^3 GEMMs on " + engine->name() +
                      ", median of " + std::to_string(kTimed) + ")"};
}

}  // namespace anvil::train
