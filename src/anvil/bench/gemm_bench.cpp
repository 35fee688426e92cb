#include "anvil/bench/gemm_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <set>

#include "anvil/base/bf16.hpp"
#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/process.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/gemm_shapes.hpp"

namespace anvil::bench {
namespace {

using json = nlohmann::json;
using device::GemmBackend;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string dims_text(const GemmCase& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k);
}

std::string op_text(const GemmCase& c) {
  return std::string(c.trans_a ? "T" : "N") + (c.trans_b ? "T" : "N");
}

std::string alignment_label(int64_t n) {
  int64_t a = 1;
  while (a < 256 && n % (2 * a) == 0) a *= 2;
  return "mult of " + std::to_string(a) + (a == 256 ? "+" : "");
}

// Operands of one case, filled once with values in [-1, 1].
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;
  std::vector<bf16> a16, b16;

  Operands(const GemmCase& g, bool with_bf16) {
    lda = g.trans_a ? g.m : g.k;
    ldb = g.trans_b ? g.k : g.n;
    ldc = g.n;
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    a.resize(static_cast<size_t>(std::max<int64_t>(1, g.m * g.k)));
    b.resize(static_cast<size_t>(std::max<int64_t>(1, g.k * g.n)));
    c.assign(static_cast<size_t>(std::max<int64_t>(1, g.m * g.n)), 0.0f);
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    if (with_bf16) {
      a16.resize(a.size());
      b16.resize(b.size());
      for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
      for (size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
    }
  }

  void run(const GemmCase& g, const std::string& dtype, GemmBackend backend) {
    if (dtype == "bf16") {
      device::gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a16.data(), lda, b16.data(), ldb,
                   0.0f, c.data(), ldc, backend);
    } else {
      device::gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                   c.data(), ldc, backend);
    }
  }

  void run_raw_blas(const GemmCase& g) {
    device::blas_sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb,
                       0.0f, c.data(), ldc);
  }
};

double gflops_of(const GemmCase& g, double seconds) {
  return g.flops() / seconds / 1e9;
}

json case_json(const GemmCase& c) {
  return {{"label", c.label},    {"m", c.m}, {"n", c.n}, {"k", c.k}, {"trans_a", c.trans_a},
          {"trans_b", c.trans_b}};
}

GemmCase case_from_json(const json& j) {
  const auto dim = [&](const char* k) { return json_integer(j.at(k), k, 1, INT32_MAX); };
  return GemmCase{j.at("label").get<std::string>(), dim("m"), dim("n"), dim("k"),
                  j.at("trans_a").get<bool>(),      j.at("trans_b").get<bool>()};
}

json timing_json(const TimingPolicy& t) {
  return {{"min_seconds", t.min_seconds},
          {"min_samples", t.min_samples},
          {"max_samples", t.max_samples},
          {"warmup", t.warmup}};
}

TimingPolicy timing_from_json(const json& j) {
  TimingPolicy t;
  t.min_seconds = j.at("min_seconds").get<double>();
  const auto count = [&](const char* k) {
    return static_cast<int>(json_integer(j.at(k), k, 0, INT32_MAX));
  };
  t.min_samples = count("min_samples");
  t.max_samples = count("max_samples");
  t.warmup = count("warmup");
  return t;
}

// A baseline measured in a child process, which loads its own OpenBLAS with
// another core type. The child stays up for the whole run and measures one
// shape per request, so its measurements interleave with ours and a slow
// period of a noisy machine hits both alike.
class BaselineChild {
 public:
  BaselineChild(const std::vector<GemmCase>& cases, const TimingPolicy& timing,
                const std::map<std::string, std::string>& env) {
    json spec = {{"cases", json::array()}, {"timing", timing_json(timing)}};
    for (const auto& c : cases) spec["cases"].push_back(case_json(c));
    char path[] = "/tmp/anvil-gemm-spec-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) throw SystemError("cannot create a spec file in /tmp");
    ::close(fd);
    spec_path_ = path;
    write_file_atomic(spec_path_, spec.dump());
    child_ =
        std::make_unique<ChildProcess>(std::vector<std::string>{self_executable(), "bench", "gemm",
                                                                "--internal-raw-blas", spec_path_},
                                       env);
    const std::string hello = child_->read_line();
    if (hello.rfind("ready ", 0) != 0) throw SystemError("baseline child said '" + hello + "'");
    corename_ = hello.substr(6);
  }

  ~BaselineChild() {
    if (child_) child_->finish();
    std::filesystem::remove(spec_path_);
  }

  double measure(size_t case_index, int threads) {
    child_->send_line(std::to_string(case_index) + " " + std::to_string(threads));
    return std::stod(child_->read_line());
  }

  const std::string& corename() const { return corename_; }

 private:
  std::string spec_path_;
  std::unique_ptr<ChildProcess> child_;
  std::string corename_;
};

}  // namespace

double work_for_fraction(std::vector<std::pair<double, double>> points, double peak,
                         double fraction) {
  if (points.empty() || !(peak > 0)) return kNaN;
  std::sort(points.begin(), points.end());
  // Walk down from the largest work while every point stays above the bar.
  double answer = kNaN;
  for (auto it = points.rbegin(); it != points.rend(); ++it) {
    if (it->second < fraction * peak) break;
    answer = it->first;
  }
  return answer;
}

std::vector<GemmCase> gemm_cases(const GemmBenchOptions& o) {
  std::vector<GemmCase> cases;
  for (int64_t s : o.sizes) {
    if (s < 1) throw InputError("--sizes: expected sizes >= 1, got " + std::to_string(s));
  }
  if (o.preset == "square") {
    std::vector<int64_t> sizes = o.sizes;
    if (sizes.empty()) sizes = {128, 256, 512, 1024, 2048};
    for (int64_t n : sizes) cases.push_back({"square", n, n, n, false, false});
  } else if (o.preset == "aligned") {
    std::vector<int64_t> bases = o.sizes;
    if (bases.empty()) bases = {1024};
    for (int64_t base : bases) {
      // The base, then the next size that is a multiple of exactly 1, 8, 16,
      // 64 and 128: shows the cost of misalignment and tile quantization.
      const int64_t round = (base + 127) / 128 * 128;
      for (int64_t n : {base, round + 1, round + 8, round + 16, round + 64, round + 128}) {
        cases.push_back({alignment_label(n), n, n, n, false, false});
      }
    }
  } else if (o.preset == "model") {
    if (o.config_path.empty()) throw InputError("--config: required with --preset model");
    const model::ModelConfig cfg = model::load_model_config(o.config_path, o.overrides);
    if (o.tokens < 1) throw InputError("--tokens: expected >= 1, got " + std::to_string(o.tokens));
    int64_t tpe = o.tokens_per_expert;
    if (tpe == 0 && cfg.n_experts > 0) {
      tpe = std::max<int64_t>(1, (o.tokens * cfg.top_k + cfg.n_experts - 1) / cfg.n_experts);
    }
    for (const auto& g : model::layer_gemms(cfg, o.tokens, tpe, o.backward)) {
      cases.push_back({g.name, g.m, g.n, g.k, g.trans_a, g.trans_b});
    }
  } else if (o.preset == "grid") {
    const std::vector<int64_t> values = o.sizes.empty() ? kGridSizes : o.sizes;
    for (int64_t m : values) {
      for (int64_t n : values) {
        for (int64_t k : values) {
          if (2.0 * static_cast<double>(m) * n * k > kGridMaxFlops) continue;
          cases.push_back({"grid.fwd", m, n, k, false, true});
          cases.push_back({"grid.dgrad", m, n, k, false, false});
          cases.push_back({"grid.wgrad", m, n, k, true, false});
        }
      }
    }
  } else {
    throw InputError("--preset: expected square, aligned, model or grid, got '" + o.preset + "'");
  }
  return cases;
}

namespace {

using Children = std::vector<std::pair<std::string, std::unique_ptr<BaselineChild>>>;

std::set<std::string> checked_baselines(const GemmBenchOptions& o) {
  for (const auto& d : o.dtypes) {
    if (d != "f32" && d != "bf16")
      throw InputError("--dtype: expected f32 or bf16, got '" + d + "'");
  }
  std::set<std::string> baselines(o.baselines.begin(), o.baselines.end());
  for (const auto& b : baselines) {
    if (b != "library" && b != "env" && b != "openblas" && b != "onednn" && b != "naive" &&
        b != "none" && !(b.rfind("coretype:", 0) == 0 && b.size() > 9)) {
      throw InputError(
          "--baselines: expected library, env, openblas, onednn, naive, "
          "coretype:NAME or none, got '" +
          b + "'");
    }
  }
  return baselines;
}

// The raw library in child processes: with its own detection, with the
// inherited OPENBLAS_CORETYPE when that differs from anvil's choice, and
// with any core type asked for.
Children start_children(const GemmBenchOptions& o, const std::set<std::string>& baselines,
                        const std::vector<GemmCase>& cases, GemmBenchResult& result) {
  const device::BlasInfo& blas = device::blas_info();
  std::vector<std::pair<std::string, std::map<std::string, std::string>>> child_envs;
  if (baselines.count("library")) {
    child_envs.push_back(
        {"library", {{"ANVIL_BLAS_CORETYPE", "library"}, {"OPENBLAS_CORETYPE", ""}}});
  }
  if (baselines.count("env") && !blas.inherited.empty() && blas.inherited != blas.corename) {
    child_envs.push_back(
        {"env", {{"ANVIL_BLAS_CORETYPE", "env"}, {"OPENBLAS_CORETYPE", blas.inherited}}});
  }
  for (const auto& b : baselines) {
    if (b.rfind("coretype:", 0) != 0) continue;
    const std::string core = b.substr(9);
    child_envs.push_back({b, {{"ANVIL_BLAS_CORETYPE", core}, {"OPENBLAS_CORETYPE", core}}});
  }
  const bool any_f32 = std::count(o.dtypes.begin(), o.dtypes.end(), "f32") > 0;
  Children children;
  for (const auto& [name, env] : any_f32 ? child_envs : decltype(child_envs){}) {
    try {
      auto child = std::make_unique<BaselineChild>(cases, o.timing, env);
      const std::string how = name == "library" ? std::string("library's own detection")
                              : name == "env"   ? "inherited OPENBLAS_CORETYPE=" + blas.inherited
                                                : "OPENBLAS_CORETYPE=" + name.substr(9);
      result.baseline_notes[name] =
          "raw OpenBLAS sgemm in a child process, " + how + ": " + child->corename() + " kernels";
      children.push_back({name, std::move(child)});
    } catch (const std::exception& e) {
      result.baseline_notes[name] = std::string("not measured: ") + e.what();
    }
  }
  return children;
}

// bf16: the other path beside the chosen one, where the CPU can run both.
struct OtherBf16 {
  std::string name;  // "" : none
  GemmBackend backend = GemmBackend::emulated;
};

OtherBf16 other_bf16_path(GemmBenchResult& result) {
  OtherBf16 other;
  const device::Bf16Path path = device::bf16_path();
  result.bf16_path = device::bf16_path_description(path);
  if (!device::bf16_native_available()) return other;
  const bool native = path == device::Bf16Path::native;
  other.name = native ? "bf16-emulated" : "bf16-native";
  other.backend = native ? GemmBackend::emulated : GemmBackend::onednn;
  result.baseline_notes[other.name] =
      "bf16 rows: " +
      device::bf16_path_description(native ? device::Bf16Path::emulated : device::Bf16Path::native);
  return other;
}

// One shape in this process: anvil's GEMM and the in-process baselines.
// `earlier`: this shape's samples from the earlier passes, pooled with this one's.
void time_in_process(GemmRow& row, const GemmBenchOptions& o,
                     const std::set<std::string>& baselines, const OtherBf16& other, bool any_bf16,
                     const Samples& earlier) {
  const GemmCase& g = row.shape;
  const std::string& dtype = row.dtype;
  Operands ops(g, any_bf16);
  auto rate = [&](GemmBackend backend, const TimingPolicy& timing) {
    return gflops_of(g, time_calls([&] { ops.run(g, dtype, backend); }, timing).median());
  };
  Samples s = time_calls([&] { ops.run(g, dtype, GemmBackend::automatic); }, o.timing);
  s.seconds.insert(s.seconds.end(), earlier.seconds.begin(), earlier.seconds.end());
  row.gflops = gflops_of(g, s.median());
  row.gflops_best = gflops_of(g, s.best());
  if (dtype == "f32" && baselines.count("openblas"))
    row.baseline_gflops["openblas"] = rate(GemmBackend::openblas, o.timing);
  if (dtype == "f32" && baselines.count("onednn"))
    row.baseline_gflops["onednn"] = rate(GemmBackend::onednn, o.timing);
  if (dtype == "bf16" && !other.name.empty())
    row.baseline_gflops[other.name] = rate(other.backend, o.timing);
  if (baselines.count("naive") && g.flops() <= o.naive_max_flops) {
    TimingPolicy once = o.timing;
    once.min_samples = 1;
    once.warmup = 0;
    row.baseline_gflops["naive"] = rate(GemmBackend::reference, once);
  }
}

}  // namespace

void summarize_gemm(GemmBenchResult& result, const std::vector<std::string>& dtypes,
                    const std::vector<int>& threads) {
  for (const auto& dtype : dtypes) {
    for (int t : threads) {
      GemmSummary s{dtype, t, 0, kNaN, {}};
      for (const auto& r : result.rows) {
        if (r.dtype == dtype && r.threads == t) s.peak_gflops = std::max(s.peak_gflops, r.gflops);
      }
      std::vector<std::pair<double, double>> points;
      for (auto& r : result.rows) {
        if (r.dtype != dtype || r.threads != t) continue;
        r.pct_of_peak = s.peak_gflops > 0 ? 100.0 * r.gflops / s.peak_gflops : 0;
        points.push_back({r.shape.flops(), r.gflops});
        s.efficiency_curve.push_back({r.shape.flops(), r.gflops / s.peak_gflops});
      }
      std::sort(s.efficiency_curve.begin(), s.efficiency_curve.end());
      s.work_for_90pct_flops = work_for_fraction(points, s.peak_gflops, 0.9);
      result.summaries.push_back(std::move(s));
    }
  }
}

GemmBenchResult run_gemm_bench(const GemmBenchOptions& o) {
  if (o.device == device::DeviceKind::cuda) return run_gemm_bench_gpu(o);
  for (const auto& d : o.dtypes) {
    if (d != "f32" && d != "bf16")
      throw InputError("--dtype: the CPU GEMM bench measures f32 and bf16, got '" + d +
                       "' (tf32, fp16 and fp8 are for --device cuda)");
  }
  if (o.passes < 1) throw InputError("--passes: expected >= 1, got " + std::to_string(o.passes));
  const std::set<std::string> baselines = checked_baselines(o);
  std::vector<int> threads = o.threads;
  if (threads.empty()) threads = {cpu_info().logical_cpus};
  for (int t : threads) {
    if (t < 1) throw InputError("--threads: expected >= 1, got " + std::to_string(t));
  }
  const std::vector<GemmCase> cases = gemm_cases(o);
  const bool any_bf16 = std::count(o.dtypes.begin(), o.dtypes.end(), "bf16") > 0;
  GemmBenchResult result;
  result.preset = o.preset;
  Children children = start_children(o, baselines, cases, result);
  if (baselines.count("openblas")) {
    result.baseline_notes["openblas"] =
        "OpenBLAS sgemm in this process (" + device::blas_info().corename + " kernels)";
  }
  if (baselines.count("onednn")) result.baseline_notes["onednn"] = "oneDNN f32 matmul";
  const OtherBf16 other = any_bf16 ? other_bf16_path(result) : OtherBf16{};
  if (baselines.count("naive")) {
    result.baseline_notes["naive"] = "reference triple loop (double accumulation), shapes up to " +
                                     fmt(o.naive_max_flops / 1e9, 3) + " GFLOP";
  }
  const size_t per_pass = cases.size() * threads.size() * o.dtypes.size();
  const size_t total = per_pass * static_cast<size_t>(o.passes);
  size_t done = 0;
  // Every pass times anvil's GEMM; the last pools the earlier passes' calls
  // with its own and adds the baselines.
  std::vector<Samples> earlier(per_pass);
  for (int pass = 0; pass < o.passes; ++pass) {
    const bool last = pass + 1 == o.passes;
    const std::string label = last ? "" : "pass " + std::to_string(pass + 1) + " ";
    size_t i = 0;
    for (const auto& dtype : o.dtypes) {
      for (int t : threads) {
        set_num_threads(t);
        for (size_t ci = 0; ci < cases.size(); ++ci, ++i) {
          const GemmCase& g = cases[ci];
          progress_line(o.progress, done++, total,
                        label + dtype + " " + std::to_string(t) + "T " + dims_text(g));
          if (!last) {
            Operands ops(g, any_bf16);
            const Samples s =
                time_calls([&] { ops.run(g, dtype, GemmBackend::automatic); }, o.timing);
            earlier[i].seconds.insert(earlier[i].seconds.end(), s.seconds.begin(), s.seconds.end());
            continue;
          }
          GemmRow row{g, dtype, t, 0, 0, 0, {}, kNaN};
          time_in_process(row, o, baselines, other, any_bf16, earlier[i]);
          // (our buffers are freed before a child allocates its own)
          for (auto& [name, child] : children) {
            if (dtype != "f32") break;
            try {
              row.baseline_gflops[name] = child->measure(ci, t);
            } catch (const std::exception& e) {
              result.baseline_notes[name] = std::string("failed: ") + e.what();
            }
          }
          result.rows.push_back(std::move(row));
        }
      }
    }
  }
  progress_line(o.progress, total, total, "");
  set_num_threads(cpu_info().logical_cpus);
  summarize_gemm(result, o.dtypes, threads);
  return result;
}

int run_raw_blas_child(const std::string& spec_path) {
  const json spec = json::parse(read_file(spec_path));
  std::vector<GemmCase> cases;
  for (const auto& c : spec.at("cases")) cases.push_back(case_from_json(c));
  const TimingPolicy timing = timing_from_json(spec.at("timing"));
  std::cout << "ready " << device::blas_info().corename << std::endl;
  size_t index = 0;
  int threads = 0;
  while (std::cin >> index >> threads) {
    if (index >= cases.size() || threads < 1) {
      throw InputError("--internal-raw-blas: bad request " + std::to_string(index) + " " +
                       std::to_string(threads));
    }
    set_num_threads(threads);
    Operands ops(cases[index], false);
    const Samples s = time_calls([&] { ops.run_raw_blas(cases[index]); }, timing);
    std::cout << gflops_of(cases[index], s.median()) << std::endl;
  }
  return 0;
}

json GemmBenchResult::to_json() const {
  const device::BlasInfo& blas = device::blas_info();
  json j = {{"benchmark", "gemm"},
            {"blas",
             {{"library", blas.library},
              {"corename", blas.corename},
              {"policy", blas.policy},
              {"requested", blas.requested},
              {"inherited", blas.inherited},
              {"reason", blas.reason}}},
            {"baselines", baseline_notes},
            {"bf16_path", bf16_path.empty() ? json(nullptr) : json(bf16_path)},
            {"rows", json::array()},
            {"summaries", json::array()}};
  for (const auto& r : rows) {
    json row = case_json(r.shape);
    row["dtype"] = r.dtype;
    row["threads"] = r.threads;
    row["flops"] = r.shape.flops();
    row["gflops"] = r.gflops;
    row["gflops_best"] = r.gflops_best;
    row["pct_of_peak"] = r.pct_of_peak;
    row["pct_of_datasheet"] =
        std::isnan(r.pct_of_datasheet) ? json(nullptr) : json(r.pct_of_datasheet);
    row["baselines_gflops"] = r.baseline_gflops;
    j["rows"].push_back(row);
  }
  for (const auto& s : summaries) {
    json curve = json::array();
    for (const auto& [w, e] : s.efficiency_curve)
      curve.push_back({{"flops", w}, {"efficiency", e}});
    j["summaries"].push_back(
        {{"dtype", s.dtype},
         {"threads", s.threads},
         {"peak_gflops", s.peak_gflops},
         {"work_for_90pct_flops",
          std::isnan(s.work_for_90pct_flops) ? json(nullptr) : json(s.work_for_90pct_flops)},
         {"efficiency_curve", curve}});
  }
  return j;
}

Table GemmBenchResult::to_table() const {
  std::vector<std::string> names;
  for (const auto& r : rows) {
    for (const auto& [b, _] : r.baseline_gflops) {
      if (std::find(names.begin(), names.end(), b) == names.end()) names.push_back(b);
    }
  }
  // A fixed order: the library baselines first, the naive loop last.
  auto rank = [](const std::string& b) {
    return b == "library"                 ? 0
           : b == "env"                   ? 1
           : b.rfind("coretype:", 0) == 0 ? 2
           : b == "openblas"              ? 3
           : b == "onednn"                ? 4
                                          : 5;
  };
  std::stable_sort(names.begin(), names.end(),
                   [&](const std::string& x, const std::string& y) { return rank(x) < rank(y); });
  std::vector<std::string> cols = {"shape", "MxNxK",   "op",   "dtype",
                                   "thr",   "GFLOP/s", "best", "%peak"};
  const bool sheet = std::any_of(rows.begin(), rows.end(),
                                 [](const GemmRow& r) { return !std::isnan(r.pct_of_datasheet); });
  if (sheet) cols.push_back("%sheet");
  for (const auto& b : names) {
    cols.push_back(b + " GF/s");
    cols.push_back("x " + b);
  }
  Table table(cols);
  for (const auto& r : rows) {
    std::vector<std::string> cells = {
        r.shape.label, dims_text(r.shape), op_text(r.shape),  r.dtype, std::to_string(r.threads),
        fmt(r.gflops), fmt(r.gflops_best), fmt(r.pct_of_peak)};
    if (sheet) cells.push_back(std::isnan(r.pct_of_datasheet) ? "-" : fmt(r.pct_of_datasheet));
    for (const auto& b : names) {
      const auto it = r.baseline_gflops.find(b);
      cells.push_back(it == r.baseline_gflops.end() ? "-" : fmt(it->second));
      cells.push_back(it == r.baseline_gflops.end() ? "-" : fmt(r.gflops / it->second, 2));
    }
    table.add_row(std::move(cells));
  }
  return table;
}

std::string GemmBenchResult::summary_text() const {
  std::string out;
  for (const auto& s : summaries) {
    out += s.dtype + ", " + std::to_string(s.threads) + " thread(s): peak " + fmt(s.peak_gflops) +
           " GFLOP/s; 90% of peak from ";
    out += std::isnan(s.work_for_90pct_flops)
               ? std::string("(not reached in this sweep)")
               : significant(s.work_for_90pct_flops / 1e9) + " GFLOP per GEMM";
    out += "\n";
  }
  if (!bf16_path.empty()) out += "bf16 rows: " + bf16_path + "\n";
  for (const auto& [name, note] : baseline_notes) out += "baseline " + name + ": " + note + "\n";
  return out;
}

void add_to_profile(const GemmBenchResult& result, plan::HwProfile& profile) {
  int most = 0;
  for (const auto& r : result.rows) most = std::max(most, r.threads);
  for (const auto& r : result.rows) {
    if (r.threads != most || !(r.gflops > 0)) continue;
    const plan::GemmShapePoint point{r.dtype,         r.shape.m,       r.shape.n, r.shape.k,
                                     r.shape.trans_a, r.shape.trans_b, r.threads, r.gflops};
    auto& shapes = result.preset == "grid" ? profile.gemm_grid : profile.gemm_shapes;
    shapes.erase(std::remove_if(shapes.begin(), shapes.end(),
                                [&](const plan::GemmShapePoint& g) {
                                  return g.dtype == point.dtype && g.m == point.m &&
                                         g.n == point.n && g.k == point.k &&
                                         g.trans_a == point.trans_a && g.trans_b == point.trans_b;
                                }),
                 shapes.end());
    shapes.push_back(point);
  }
}

}  // namespace anvil::bench
