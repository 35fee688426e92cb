#include "anvil/bench/gpu_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/device/gemm_engine.hpp"
#include "anvil/device/stream_kernels.hpp"

namespace anvil::bench {
namespace {

using device::DeviceKind;

// Times `body` (work queued on `stream`) with CUDA events: each sample is a
// batch of calls lasting at least ~1 ms, divided by its calls.
Samples time_on_gpu(device::Stream& stream, const std::function<void()>& body,
                    const TimingPolicy& policy) {
  device::Event start(DeviceKind::cuda), stop(DeviceKind::cuda);
  body();
  stream.synchronize();
  start.record(stream);
  body();
  stop.record(stream);
  stop.synchronize();
  const double one = std::max(device::Event::elapsed_ms(start, stop) / 1e3, 1e-7);
  const int reps = static_cast<int>(std::clamp(1e-3 / one, 1.0, 1000.0));
  for (int w = 0; w < policy.warmup; ++w) body();
  Samples out;
  double timed = 0;
  while ((timed < policy.min_seconds || static_cast<int>(out.seconds.size()) < policy.min_samples) &&
         static_cast<int>(out.seconds.size()) < policy.max_samples) {
    // An untimed call ahead keeps the GPU busy while the timed ones are
    // queued: after the last synchronize it is idle, and the gap until the
    // first launch would count in the sample.
    body();
    start.record(stream);
    for (int r = 0; r < reps; ++r) body();
    stop.record(stream);
    stop.synchronize();
    const double s = device::Event::elapsed_ms(start, stop) / 1e3;
    out.seconds.push_back(s / reps);
    timed += s;
  }
  return out;
}

// Random inputs in [-1, 1) in `type`'s encoding, on the GPU.
device::DeviceBuffer random_on_gpu(Dtype type, int64_t count, uint32_t seed,
                                   device::Stream& stream, const std::string& name) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = u(rng);
  const auto bytes = device::encode(values, type);
  device::DeviceBuffer buf(DeviceKind::cuda, bytes.size(), name);
  device::upload(bytes, buf.data(), stream);
  return buf;
}

// The profile's word for a GEMM type ("f32", "f16", ...).
std::string peak_word(Dtype t) {
  switch (t) {
    case Dtype::fp32:
      return "f32";
    case Dtype::fp16:
      return "f16";
    default:
      return anvil::to_string(t);
  }
}

// One GEMM row: the default algorithm, then the best of the top candidates.
GemmRow time_gemm(device::GemmEngine& engine, device::Stream& stream, const GemmCase& g,
                  const std::string& dtype, const GemmBenchOptions& o, double datasheet_gflops,
                  int64_t l2_bytes) {
  device::GemmDesc d;
  d.type = parse_dtype(dtype, "--dtype");
  d.trans_a = g.trans_a;
  d.trans_b = g.trans_b;
  if (d.type == Dtype::fp8) d.trans_a = false, d.trans_b = true;  // the layout fp8 takes
  d.m = g.m, d.n = g.n, d.k = g.k;
  d.out_f32 = d.type == Dtype::fp32 || d.type == Dtype::tf32 ||
              (o.low_out_f32 && (d.type == Dtype::bf16 || d.type == Dtype::fp16));
  GemmRow row{g, dtype, 0, 0, 0, 0, {}, std::nan("")};
  row.shape.trans_a = d.trans_a;
  row.shape.trans_b = d.trans_b;
  const std::string why = engine.unsupported(d);
  if (!why.empty()) throw InputError("--dtype " + dtype + ": " + why);
  // Operand sets rotated call by call, as many as make twice the GPU's L2,
  // so that a small shape's calls do not all find their operands in L2
  // (a training GEMM's weights and inputs mostly come from HBM).
  const auto c_bytes = static_cast<size_t>(g.m * g.n) * dtype_bytes(d.out_type());
  const auto set_bytes = static_cast<double>(g.m * g.k + g.k * g.n) * dtype_bytes(d.type) +
                         static_cast<double>(c_bytes);
  const int sets = static_cast<int>(
      std::clamp(std::ceil(2.0 * static_cast<double>(l2_bytes) / set_bytes), 1.0, 64.0));
  // The other sets are device copies of the first (other addresses, the
  // same values: drawing each on the host would take minutes over a grid).
  std::vector<device::DeviceBuffer> a, b, c;
  a.push_back(random_on_gpu(d.type, g.m * g.k, 1, stream, "gemm A"));
  b.push_back(random_on_gpu(d.type, g.k * g.n, 2, stream, "gemm B"));
  for (int i = 1; i < sets; ++i) {
    for (auto* v : {&a, &b}) {
      v->emplace_back(DeviceKind::cuda, v->front().bytes(), "gemm operand");
      device::copy(v->back().data(), v->front().data(), v->front().bytes(),
                   device::CopyKind::device_to_device, stream);
    }
  }
  for (int i = 0; i < sets; ++i) c.emplace_back(DeviceKind::cuda, c_bytes, "gemm C");
  int next = 0;
  auto call = [&](int algo) {
    return [&, algo] {
      const auto i = static_cast<size_t>(next);
      next = (next + 1) % sets;
      engine.run(d, a[i].data(), b[i].data(), c[i].data(), nullptr, stream, algo);
    };
  };
  const Samples s = time_on_gpu(stream, call(-1), o.timing);
  row.gflops = g.flops() / s.median() / 1e9;
  row.gflops_best = g.flops() / s.best() / 1e9;
  double best = row.gflops;
  TimingPolicy quick = o.timing;
  quick.min_seconds = o.timing.min_seconds / 4;
  const int n = engine.candidates(d, o.algos);
  for (int i = 0; i < n; ++i) {
    try {
      best = std::max(best, g.flops() / time_on_gpu(stream, call(i), quick).median() / 1e9);
    } catch (const SystemError&) {
      // an algorithm the heuristic proposed but that fails here is skipped
    } catch (const InputError&) {
      // or one the call's own alignment leaves out of its (shorter) list
    }
  }
  row.baseline_gflops["best-algo"] = best;
  if (datasheet_gflops > 0) row.pct_of_datasheet = 100.0 * row.gflops / datasheet_gflops;
  return row;
}

}  // namespace

std::optional<plan::HwProfile> gpu_datasheet(const device::GpuProperties& gpu) {
  std::string name;
  // The SXM parts only: H100 PCIe has 114 SMs; the NVL parts (H100 NVL has
  // 132 SMs too) run lower clocks and power, so other peaks.
  // GH200 (Grace Hopper) is another part too; a MIG slice has fewer SMs.
  if (gpu.name.find("NVL") != std::string::npos || gpu.name.find("GH200") != std::string::npos ||
      gpu.sms != 132)
    return std::nullopt;
  if (gpu.name.find("H200") != std::string::npos) name = "h200-sxm";
  if (gpu.name.find("H100") != std::string::npos) name = "h100-sxm";
  if (name.empty()) return std::nullopt;
  try {
    return plan::find_hw_profile(name, "datasheet");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

GemmBenchResult run_gemm_bench_gpu(const GemmBenchOptions& o) {
  device::require(DeviceKind::cuda, "--device");
  const auto gpu = device::gpu_properties(0);
  const auto sheet = gpu_datasheet(gpu);
  auto engine = device::make_gemm_engine(DeviceKind::cuda);
  device::Stream stream(DeviceKind::cuda);
  const std::vector<GemmCase> cases = gemm_cases(o);
  GemmBenchResult result;
  result.preset = o.preset;
  result.baseline_notes["best-algo"] =
      "the fastest of cuBLASLt's top " + std::to_string(o.algos) +
      " heuristic algorithms for the shape, timed in the same run (" + engine->name() + ", " +
      gpu.name + ")";
  if (sheet) result.baseline_notes["datasheet"] = sheet->device + " (profiles/" + sheet->name + ")";
  const size_t total = cases.size() * o.dtypes.size();
  size_t done = 0;
  for (const auto& dtype : o.dtypes) {
    const double peak = sheet ? sheet->peak_gflops(peak_word(parse_dtype(dtype, "--dtype"))) : 0;
    for (const auto& g : cases) {
      progress_line(o.progress, done++, total, dtype + " " + std::to_string(g.m) + "x" +
                                              std::to_string(g.n) + "x" + std::to_string(g.k));
      result.rows.push_back(time_gemm(*engine, stream, g, dtype, o, peak, gpu.l2_bytes));
    }
  }
  progress_line(o.progress, total, total, "");
  summarize_gemm(result, o.dtypes, {0});
  return result;
}

MembwResult run_membw_bench_gpu(const MembwOptions& o) {
  device::require(DeviceKind::cuda, "--device");
  const auto gpu = device::gpu_properties(0);
  const auto sheet = gpu_datasheet(gpu);
  std::vector<int64_t> sizes = o.sizes;
  if (sizes.empty()) {
    // From well inside L2 (50 MB on H100/H200) to far beyond it.
    for (int64_t s = 4 << 20; s <= (int64_t{4} << 30); s *= 4) sizes.push_back(s);
  }
  device::Stream stream(DeviceKind::cuda);
  device::DeviceBuffer sink(DeviceKind::cuda, sizeof(double), "membw sink");
  MembwResult result;
  const size_t total = o.kernels.size() * sizes.size();
  size_t done = 0;
  for (int64_t ws : sizes) {
    for (const auto& name : o.kernels) {
      const auto k = device::stream::parse_kernel(name, "--kernels");
      progress_line(o.progress, done++, total, name + " " + std::to_string(ws) + " B");
      const int64_t elems = std::max<int64_t>(ws / (device::stream::arrays_of(k) * 8), 64) / 2 * 2;
      std::vector<device::DeviceBuffer> arrays;  // zeroed on the GPU (no host copies)
      for (int i = 0; i < 3; ++i) {
        arrays.emplace_back(DeviceKind::cuda, static_cast<size_t>(elems) * 8, "membw array");
        device::zero(arrays.back().data(), static_cast<size_t>(elems) * 8, stream);
      }
      TimingPolicy policy;
      policy.min_seconds = o.min_seconds;
      policy.min_samples = 5;
      const Samples s = time_on_gpu(stream, [&] {
        device::stream::run_device_passes(stream, k, arrays[0].as<double>(),
                                          arrays[1].as<double>(), arrays[2].as<double>(), elems,
                                          1, sink.as<double>());
      }, policy);
      const double bytes = static_cast<double>(device::stream::bytes_per_element(k) * elems);
      MembwRow row{name, ws, 0, bytes / s.best() / 1e9, bytes / s.median() / 1e9, 0, std::nan("")};
      if (sheet && sheet->memory_bandwidth_gbs > 0)
        row.pct_of_datasheet = 100.0 * row.gbs / sheet->memory_bandwidth_gbs;
      result.rows.push_back(row);
    }
  }
  progress_line(o.progress, total, total, "");
  set_pct_of_best(result.rows);
  return result;
}

nlohmann::json gpu_report() {
  const std::string why = device::cuda_unavailable_reason();
  if (!why.empty()) return {{"available", false}, {"reason", why}};
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < device::gpu_count(); ++i) {
    const auto g = device::gpu_properties(i);
    nlohmann::json j = {{"ordinal", g.ordinal},
                        {"name", g.name},
                        {"compute_capability", std::to_string(g.cc_major) + "." +
                                                   std::to_string(g.cc_minor)},
                        {"sms", g.sms},
                        {"clock_ghz", g.clock_ghz},
                        {"memory_bytes", g.memory_bytes},
                        {"memory_bus_bits", g.memory_bus_bits},
                        {"l2_bytes", g.l2_bytes},
                        {"pci_bus_id", g.pci_bus_id},
                        {"pcie_link", g.pcie_link},
                        {"nvlinks_active", g.nvlinks_active},
                        {"driver_version", g.driver_version},
                        {"runtime_version", g.runtime_version},
                        {"cublaslt_version", g.cublaslt_version},
                        {"nccl_version", g.nccl_version},
                        {"fp8", g.has_fp8}};
    if (const auto sheet = gpu_datasheet(g)) {
      nlohmann::json peaks = nlohmann::json::object();
      for (const auto& p : sheet->peak) peaks[p.dtype] = p.gflops;
      j["datasheet"] = {{"profile", sheet->name},
                        {"device", sheet->device},
                        {"memory_bandwidth_gbs", sheet->memory_bandwidth_gbs},
                        {"peak_gflops", peaks},
                        {"sources", nlohmann::json::array()}};
      for (const auto& s : sheet->sources)
        j["datasheet"]["sources"].push_back({{"field", s.field}, {"source", s.source}});
    }
    gpus.push_back(j);
  }
  return {{"available", true}, {"devices", gpus}};
}

std::string gpu_report_text(const nlohmann::json& gpus) {
  if (!gpus.value("available", false))
    return "GPU:      none (" + gpus.value("reason", std::string("unknown")) + ")\n";
  std::string out;
  for (const auto& g : gpus["devices"]) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "GPU %d:    %s, compute %s, %d SMs at %.2f GHz, %.1f GiB HBM, L2 %.0f MiB\n",
                  g["ordinal"].get<int>(), g["name"].get<std::string>().c_str(),
                  g["compute_capability"].get<std::string>().c_str(), g["sms"].get<int>(),
                  g["clock_ghz"].get<double>(), g["memory_bytes"].get<double>() / (1 << 30),
                  g["l2_bytes"].get<double>() / (1 << 20));
    out += line;
    // CUDA versions as "13.0" (the driver's: the newest CUDA it runs).
    auto cuda_version = [](int v) {
      return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
    };
    const int links = g["nvlinks_active"].get<int>();
    const std::string nvlinks = links < 0 ? "n/a (no NVML)" : std::to_string(links);
    std::snprintf(
        line, sizeof line,
        "          PCI %s, link %s, NVLinks active %s; driver for CUDA %s, runtime %s, "
        "cuBLASLt %d, NCCL %s\n",
        g.value("pci_bus_id", std::string("?")).c_str(),
        g["pcie_link"].get<std::string>().empty() ? "unknown"
                                                  : g["pcie_link"].get<std::string>().c_str(),
        nvlinks.c_str(), cuda_version(g["driver_version"].get<int>()).c_str(),
        cuda_version(g["runtime_version"].get<int>()).c_str(), g["cublaslt_version"].get<int>(),
        g["nccl_version"].get<std::string>().empty()
            ? "not found"
            : g["nccl_version"].get<std::string>().c_str());
    out += line;
    if (g.contains("datasheet")) {
      const auto& d = g["datasheet"];
      std::string peaks;
      for (const auto& [dt, v] : d["peak_gflops"].items())
        peaks += " " + dt + " " + std::to_string(static_cast<int>(v.get<double>() / 1000)) + "T";
      out += "          datasheet (profiles/" + d["profile"].get<std::string>() +
             "): HBM " + std::to_string(static_cast<int>(d["memory_bandwidth_gbs"].get<double>())) +
             " GB/s; dense peak FLOP/s" + peaks + "\n";
    }
  }
  return out;
}

plan::HwProfile measure_gpu_profile(const ProfileOptions& o) {
  const auto gpu = device::gpu_properties(0);
  plan::HwProfile p;
  p.name = "local-gpu";
  p.device = gpu.name;
  p.kind = "gpu";
  p.origin = "measured";
  p.created = today_utc();
  p.compute_units = gpu.sms;
  p.compute_unit_name = "SM";
  p.clock_ghz = gpu.clock_ghz;
  p.memory_bytes = gpu.memory_bytes;
  if (const auto sheet = gpu_datasheet(gpu)) p.interconnect = sheet->interconnect;

  GemmBenchOptions g;
  g.device = DeviceKind::cuda;
  g.preset = "grid";
  g.dtypes = {"bf16", "f32", "tf32"};
  g.low_out_f32 = true;  // bf16 writes fp32, as the trainer's GEMMs do
  g.algos = 1;
  g.timing.min_seconds = o.min_seconds;
  g.progress = o.progress;
  const GemmBenchResult grid = run_gemm_bench_gpu(g);
  for (const auto& s : grid.summaries) p.peak.push_back({s.dtype, 0, s.peak_gflops});
  add_to_profile(grid, p);
  for (const auto& s : grid.summaries) {
    if (!std::isnan(s.work_for_90pct_flops)) p.work_for_90pct_flops[s.dtype] = s.work_for_90pct_flops;
    for (const auto& [w, e] : s.efficiency_curve) p.gemm_efficiency[s.dtype].push_back({w, e});
  }

  MembwOptions m;
  m.device = DeviceKind::cuda;
  m.kernels = {"copy", "triad"};
  m.min_seconds = o.min_seconds;
  m.progress = o.progress;
  // The HBM figure from working sets of at least 4x L2 only: at 1-2x L2 a
  // share of the accesses still hits L2 and reads above HBM's rate.
  const double l2 = static_cast<double>(gpu.l2_bytes);
  double hbm_any = 0;
  for (const auto& r : run_membw_bench_gpu(m).rows) {
    const auto bytes = static_cast<double>(r.bytes);
    const std::string level = bytes <= 0.5 * l2 ? "L2" : "HBM";
    if (r.kernel == "triad") p.memory_levels.push_back({level, r.bytes, 0, r.gbs});
    if (level == "HBM") hbm_any = std::max(hbm_any, r.gbs);
    if (bytes >= 4 * l2) p.memory_bandwidth_gbs = std::max(p.memory_bandwidth_gbs, r.gbs);
  }
  if (p.memory_bandwidth_gbs == 0) p.memory_bandwidth_gbs = hbm_any;
  p.sources.push_back({"*", "measured",
                       "anvil hw --profile on " + gpu.name + " (bench gemm --device cuda grid "
                       "bf16/f32/tf32, bench membw --device cuda copy/triad) on " + p.created});
  return p;
}

}  // namespace anvil::bench
