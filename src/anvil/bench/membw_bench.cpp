#include "anvil/bench/membw_bench.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/device/stream_kernels.hpp"

namespace anvil::bench {
namespace {

namespace stream = device::stream;

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<double[], FreeDeleter>;

Buffer aligned_doubles(int64_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(double)) !=
      0) {
    throw SystemError("membw: cannot allocate " + std::to_string(n * 8) + " bytes");
  }
  return Buffer(static_cast<double*>(p));
}

using stream::Kernel;

// The slice of [0, n) that libgomp's schedule(static) gives thread `tid` of
// `nt`: the threads that first touched the pages keep using them.
std::pair<int64_t, int64_t> static_slice(int64_t n, int64_t nt, int64_t tid) {
  const int64_t q = n / nt, r = n % nt;
  const int64_t lo = tid < r ? tid * (q + 1) : tid * q + r;
  return {lo, lo + (tid < r ? q + 1 : q)};
}

// `reps` passes of one kernel. Each thread works on its own static slice with
// no barrier between passes, so cache-resident sizes measure each core's own
// cache and no OpenMP scheduling cost is paid per pass.
double run_passes(Kernel kernel, double* a, double* b, double* c, int64_t n, int reps) {
  const double s = stream::kScalar;
  double sink = 0.0;
#pragma omp parallel reduction(+ : sink)
  {
    const auto [lo, hi] = static_slice(n, omp_get_num_threads(), omp_get_thread_num());
    for (int r = 0; r < reps; ++r) {
      switch (kernel) {
        case Kernel::copy:
          for (int64_t i = lo; i < hi; ++i) c[i] = stream::copy(a[i]);
          break;
        case Kernel::scale:
          for (int64_t i = lo; i < hi; ++i) b[i] = stream::scale(c[i], s);
          break;
        case Kernel::add:
          for (int64_t i = lo; i < hi; ++i) c[i] = stream::add(a[i], b[i]);
          break;
        case Kernel::triad:
          for (int64_t i = lo; i < hi; ++i) a[i] = stream::triad(b[i], c[i], s);
          break;
        case Kernel::read: {
          // 32 independent partial sums (4 vectors): a single accumulator
          // would be bound by add latency, not by loads.
          double acc[32] = {};
          int64_t i = lo;
          for (; i + 32 <= hi; i += 32) {
            for (int j = 0; j < 32; ++j) acc[j] = stream::read(acc[j], a[i + j]);
          }
          for (; i < hi; ++i) acc[0] += a[i];
          for (double v : acc) sink += v;
          break;
        }
        case Kernel::write:
          for (int64_t i = lo; i < hi; ++i) a[i] = stream::write(s);
          break;
      }
      __asm__ volatile("" ::: "memory");  // each pass really happens
    }
  }
  return sink;
}

}  // namespace

int arrays_of(const std::string& kernel) {
  return stream::arrays_of(stream::parse_kernel(kernel, "--kernels"));
}

MembwResult run_membw_bench(const MembwOptions& o) {
  if (o.device == device::DeviceKind::cuda) return run_membw_bench_gpu(o);
  for (const auto& k : o.kernels) arrays_of(k);
  std::vector<int64_t> sizes = o.sizes;
  if (sizes.empty()) {
    for (int64_t s = 16 << 10; s <= (int64_t{1} << 30); s *= 4) sizes.push_back(s);
  }
  for (int64_t s : sizes) {
    if (s < 1024)
      throw InputError("--sizes: expected working sets >= 1 KiB, got " + std::to_string(s));
  }
  std::vector<int> threads = o.threads;
  if (threads.empty()) {
    for (int t = 1; t <= cpu_info().logical_cpus; ++t) threads.push_back(t);
  }
  for (int t : threads) {
    if (t < 1) throw InputError("--threads: expected >= 1, got " + std::to_string(t));
  }

  MembwResult result;
  const size_t total = o.kernels.size() * sizes.size() * threads.size();
  size_t done = 0;
  for (int t : threads) {
    set_num_threads(t);
    for (int64_t ws : sizes) {
      for (const auto& kernel : o.kernels) {
        // Fresh arrays, first touched by the threads (and slices) that use them.
        const Kernel id = stream::parse_kernel(kernel, "--kernels");
        const int64_t elems = std::max<int64_t>(ws / (stream::arrays_of(id) * 8), 64);
        Buffer a = aligned_doubles(elems), b = aligned_doubles(elems), c = aligned_doubles(elems);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < elems; ++i) {
          a[i] = 1.0;
          b[i] = 2.0;
          c[i] = 0.0;
        }
        progress_line(o.progress, done++, total,
                      kernel + " " + std::to_string(ws) + " B " + std::to_string(t) + "T");
        // Enough passes per sample that a sample lasts ~2 ms (timer noise << 1%).
        const double bytes_per_pass = static_cast<double>(stream::bytes_per_element(id) * elems);
        const int reps = static_cast<int>(std::clamp(2e-3 * 20e9 / bytes_per_pass, 1.0, 1e6));
        TimingPolicy policy;
        policy.min_seconds = o.min_seconds;
        policy.min_samples = 5;
        const Samples s =
            time_calls([&] { run_passes(id, a.get(), b.get(), c.get(), elems, reps); }, policy);
        const double bytes = bytes_per_pass * reps;
        result.rows.push_back(
            {kernel, ws, t, bytes / s.best() / 1e9, bytes / s.median() / 1e9, 0, std::nan("")});
      }
    }
  }
  progress_line(o.progress, total, total, "");
  set_num_threads(cpu_info().logical_cpus);
  set_pct_of_best(result.rows);
  return result;
}

void set_pct_of_best(std::vector<MembwRow>& rows) {
  for (auto& r : rows) {
    double best = 0;
    for (const auto& q : rows) {
      if (q.kernel == r.kernel) best = std::max(best, q.gbs);
    }
    r.pct_of_best = best > 0 ? 100.0 * r.gbs / best : 0;
  }
}

nlohmann::json MembwResult::to_json() const {
  nlohmann::json j = {{"benchmark", "membw"}, {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    j["rows"].push_back({{"kernel", r.kernel},
                         {"bytes", r.bytes},
                         {"threads", r.threads},
                         {"gbs", r.gbs},
                         {"gbs_median", r.gbs_median},
                         {"pct_of_best", r.pct_of_best}});
  }
  return j;
}

Table MembwResult::to_table() const {
  Table table({"kernel", "working set", "thr", "GB/s", "median", "%best"});
  for (const auto& r : rows) {
    table.add_row({r.kernel, human_bytes(static_cast<double>(r.bytes)), std::to_string(r.threads),
                   fmt(r.gbs), fmt(r.gbs_median), fmt(r.pct_of_best)});
  }
  return table;
}

}  // namespace anvil::bench
