#include "anvil/bench/hw_report.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <dnnl.hpp>
#include <sstream>

#include "anvil/base/clock.hpp"
#include "anvil/base/cpu.hpp"
#include "anvil/base/table.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/bench/attention_bench.hpp"
#include "anvil/bench/gemm_bench.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/bench/measure.hpp"
#include "anvil/bench/membw_bench.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::bench {
namespace {

using json = nlohmann::json;

std::string mpi_library_version() {
  // Allowed before MPI_Init (MPI-3), so `anvil hw` needs no mpirun.
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string v(buf, static_cast<size_t>(len));
  const auto comma = v.find(',');  // Open MPI appends repo and date after a comma
  v = v.substr(0, comma);
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
  return v;
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream s;
  s << v->major << "." << v->minor << "." << v->patch
    << (v->cpu_runtime == DNNL_RUNTIME_OMP ? " (OpenMP)" : "");
  return s.str();
}

std::string yes_no(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

json hw_report() {
  const CpuInfo& cpu = cpu_info();
  const CpuFeatures& f = cpu.features;
  const device::BlasInfo& blas = device::blas_info();
  return {
      {"cpu",
       {{"vendor", cpu.vendor},
        {"model_name", cpu.model_name},
        {"family", cpu.family},
        {"model", cpu.model},
        {"stepping", cpu.stepping},
        {"logical_cpus", cpu.logical_cpus},
        {"physical_cores", cpu.physical_cores}}},
      {"isa",
       {{"avx2", f.avx2},
        {"fma", f.fma},
        {"avx512f", f.avx512f},
        {"avx512bw", f.avx512bw},
        {"avx512dq", f.avx512dq},
        {"avx512vl", f.avx512vl},
        {"avx512_vnni", f.avx512_vnni},
        {"avx512_bf16", f.avx512_bf16},
        {"avx512_fp16", f.avx512_fp16},
        {"amx_tile", f.amx_tile},
        {"amx_bf16", f.amx_bf16},
        {"amx_int8", f.amx_int8}}},
      {"cache",
       {{"l1d_bytes", cpu.l1d_bytes}, {"l2_bytes", cpu.l2_bytes}, {"l3_bytes", cpu.l3_bytes}}},
      {"memory_bytes", cpu.memory_bytes},
      {"threads", num_threads()},
      {"blas",
       {{"library", blas.library},
        {"config", blas.config},
        {"corename", blas.corename},
        {"policy", blas.policy},
        {"requested", blas.requested},
        {"inherited", blas.inherited},
        {"reason", blas.reason}}},
      {"onednn", onednn_version()},
      {"onednn_isa", device::onednn_cpu_isa()},
      // "avx2" when ANVIL_ISA held every run-time choice to an AVX2-only CPU's.
      {"isa_limit", cpu.isa_limit},
      {"bf16_gemm",
       {{"path", device::bf16_path() == device::Bf16Path::native ? "native" : "emulated"},
        {"native_available", device::bf16_native_available()},
        {"description", device::bf16_path_description(device::bf16_path())}}},
      {"attention_tiles",
       {{"path", kernels::attention_tiles() == kernels::AttentionTiles::kernel ? "kernel" : "blas"},
        {"description", kernels::attention_tiles_description(kernels::attention_tiles())},
        // What a bf16 run's attention takes (head sizes of 16k).
        {"bf16_description",
         kernels::attention_tiles_description(kernels::attention_tiles_for(true, 64))}}},
      {"mpi", mpi_library_version()},
      {"cuda_built", device::cuda_built()},
      {"gpus", gpu_report()},
  };
}

std::string hw_report_text(const json& r) {
  Table t({"what", "value"});
  const json& cpu = r["cpu"];
  t.add_row({"CPU", cpu["model_name"].get<std::string>() + " (" + cpu["vendor"].get<std::string>() +
                        ", family " + std::to_string(cpu["family"].get<int>()) + " model " +
                        std::to_string(cpu["model"].get<int>()) + ")"});
  t.add_row({"cores", std::to_string(cpu["physical_cores"].get<int>()) + " physical, " +
                          std::to_string(cpu["logical_cpus"].get<int>()) + " logical"});
  std::string isa;
  for (const auto& [name, on] : r["isa"].items()) {
    if (on.get<bool>()) isa += (isa.empty() ? "" : " ") + name;
  }
  t.add_row({"ISA", isa.empty() ? "(none of the tracked extensions)" : isa});
  if (r.contains("isa_limit") && !r["isa_limit"].get<std::string>().empty())
    t.add_row({"ISA limit", r["isa_limit"].get<std::string>() +
                                " (ANVIL_ISA: AVX-512 and AMX paths off, as on an AVX2-only CPU)"});
  const json& isa_j = r["isa"];
  t.add_row({"AVX-512 / BF16 / FP16 / AMX", yes_no(isa_j["avx512f"].get<bool>()) + " / " +
                                                yes_no(isa_j["avx512_bf16"].get<bool>()) + " / " +
                                                yes_no(isa_j["avx512_fp16"].get<bool>()) + " / " +
                                                yes_no(isa_j["amx_tile"].get<bool>())});
  const json& c = r["cache"];
  t.add_row({"caches", "L1d " + human_bytes(c["l1d_bytes"].get<double>()) + ", L2 " +
                           human_bytes(c["l2_bytes"].get<double>()) + ", L3 " +
                           human_bytes(c["l3_bytes"].get<double>())});
  t.add_row({"memory", human_bytes(r["memory_bytes"].get<double>())});
  t.add_row({"threads", std::to_string(r["threads"].get<int>())});
  const json& b = r["blas"];
  t.add_row({"BLAS library", b["library"].get<std::string>()});
  t.add_row({"BLAS config", b["config"].get<std::string>()});
  t.add_row({"BLAS kernels",
             b["corename"].get<std::string>() + " (" + b["reason"].get<std::string>() + ")"});
  t.add_row({"oneDNN",
             r["onednn"].get<std::string>() +
                 (r.contains("onednn_isa") ? ", kernels up to " + r["onednn_isa"].get<std::string>()
                                           : std::string())});
  t.add_row({"bf16 GEMM", r["bf16_gemm"]["description"].get<std::string>()});
  t.add_row({"attention tiles", r["attention_tiles"]["description"].get<std::string>()});
  t.add_row(
      {"attention tiles, bf16 runs", r["attention_tiles"]["bf16_description"].get<std::string>()});
  t.add_row({"MPI", r["mpi"].get<std::string>()});
  return t.to_text() + gpu_report_text(r["gpus"]);
}

namespace {

// The trainer's causal attention, forward + backward, at 8 heads of 64 and
// 2048 tokens per call, over sequence lengths: what the planner prices
// attention with on this machine (`anvil bench attention`'s timing); the
// bf16 tiles too where bf16 runs take them.
std::vector<plan::AttentionPoint> measure_attention(const ProfileOptions& o) {
  AttentionBenchOptions a;
  a.seqs = {64, 128, 256, 512, 1024, 2048};
  a.head_dims = {64};
  a.tokens = 2048;
  a.min_seconds = o.min_seconds;
  std::vector<std::string> dtypes = {"fp32"};
  if (kernels::attention_tiles_for(true, 64) == kernels::AttentionTiles::bf16)
    dtypes.push_back("bf16");
  std::vector<plan::AttentionPoint> out;
  for (const std::string& dtype : dtypes) {
    a.dtype = dtype;
    const std::string name = dtype == "fp32" ? "f32" : dtype;  // the profile's dtype names
    for (const auto& r : time_attention(a)) {
      out.push_back({name, r.seq, r.head_dim, r.total_gflops});
      if (o.progress)
        std::fprintf(stderr, "attention %s T=%lld: %.1f GFLOP/s\n", name.c_str(),
                     static_cast<long long>(r.seq), r.total_gflops);
    }
  }
  return out;
}

}  // namespace

plan::HwProfile measure_local_profile(const ProfileOptions& o) {
  const CpuInfo& cpu = cpu_info();
  plan::HwProfile p;
  p.name = "local";
  p.device = cpu.model_name;
  p.kind = "cpu";
  p.origin = "measured";
  p.created = today_utc();
  p.compute_units = cpu.physical_cores;
  p.compute_unit_name = "core";
  p.memory_bytes = cpu.memory_bytes;
  p.interconnect = {1, "shared memory", 0, 0, 0, "single node"};

  std::vector<int> threads;
  for (int t = 1; t <= cpu.logical_cpus; ++t) threads.push_back(t);

  GemmBenchOptions g;
  g.preset = "square";
  g.sizes = {32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048};
  g.dtypes = {"f32", "bf16"};
  g.threads = threads;
  g.baselines = {"none"};
  g.timing.min_seconds = o.min_seconds;
  g.progress = o.progress;
  const GemmBenchResult gemm = run_gemm_bench(g);
  for (const auto& s : gemm.summaries) {
    p.peak.push_back({s.dtype, s.threads, s.peak_gflops});
    if (s.threads != threads.back()) continue;  // curves and work at full threads
    if (!std::isnan(s.work_for_90pct_flops))
      p.work_for_90pct_flops[s.dtype] = s.work_for_90pct_flops;
    for (const auto& [w, e] : s.efficiency_curve) p.gemm_efficiency[s.dtype].push_back({w, e});
  }

  MembwOptions m;
  m.kernels = {"triad"};
  m.threads = threads;
  m.min_seconds = o.min_seconds;
  m.progress = o.progress;
  const MembwResult bw = run_membw_bench(m);
  for (const auto& r : bw.rows) {
    // A working set belongs to the smallest cache it fits in (per thread for
    // private caches), else DRAM.
    const double per_thread = static_cast<double>(r.bytes) / r.threads;
    std::string level = "DRAM";
    if (per_thread <= 0.5 * static_cast<double>(cpu.l1d_bytes))
      level = "L1";
    else if (per_thread <= 0.5 * static_cast<double>(cpu.l2_bytes))
      level = "L2";
    else if (static_cast<double>(r.bytes) <= 0.5 * static_cast<double>(cpu.l3_bytes))
      level = "L3";
    // The median pass, not the best: on a shared host a lone pass can read
    // twice the rate the others do (a 256 MiB triad on 2 threads of a VM:
    // best 71, median 33 GB/s), and the planner prices every step at it.
    p.memory_levels.push_back({level, r.bytes, r.threads, r.gbs_median});
    if (level == "DRAM")
      p.memory_bandwidth_gbs = std::max(p.memory_bandwidth_gbs, r.gbs_median);
  }
  p.attention = measure_attention(o);
  p.sources.push_back({"*", "measured",
                       "anvil hw --profile (anvil bench gemm square f32/bf16, "
                       "anvil bench membw triad, the trainer's attention kernel) on " +
                           p.created});
  return p;
}

}  // namespace anvil::bench
