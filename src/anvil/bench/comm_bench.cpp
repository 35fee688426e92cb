#include "anvil/bench/comm_bench.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/shared_buffer.hpp"
#include "anvil/bench/comm_specs.hpp"
#include "anvil/bench/measure.hpp"

namespace anvil::bench {

CommPlan comm_plan(const CommBenchOptions& o, int ranks) {
  if (o.min_bytes < 0 || o.max_bytes < o.min_bytes) {
    throw InputError("-b/-e: expected 0 <= minbytes <= maxbytes, got " +
                     std::to_string(o.min_bytes) + " and " + std::to_string(o.max_bytes));
  }
  if (!(o.factor > 1.0))
    throw InputError("-f: expected a step factor > 1, got " + std::to_string(o.factor));
  if (o.refine != 0 && !(o.refine > 1.0))
    throw InputError("--refine: expected a ratio > 1 (or 0: off), got " + std::to_string(o.refine));
  for (int64_t b : o.add_sizes) {
    if (b <= 0) throw InputError("--add-sizes: expected sizes > 0, got " + std::to_string(b));
  }
  if (o.iters < 1) throw InputError("-n: expected >= 1 iterations, got " + std::to_string(o.iters));
  if (o.root < 0 || o.root >= ranks) {
    throw InputError("--root: expected 0.." + std::to_string(ranks - 1) + ", got " +
                     std::to_string(o.root));
  }
  CommPlan plan{
      comm::parse_dtype(o.dtype, "--dtype"), comm::parse_reduce_op(o.redop, "--redop"), {}, {}, {}};
  if (plan.redop == comm::ReduceOp::avg && !comm::is_floating(plan.dtype)) {
    throw InputError("--redop avg: needs a floating --dtype, got " + o.dtype);
  }
  for (const auto& name : o.ops) {
    if (name == "all") {
      plan.specs.clear();
      for (const CollectiveSpec& spec : collective_specs()) plan.specs.push_back(&spec);
      break;
    }
    plan.specs.push_back(&spec_for(comm::parse_op(name, "--op")));
  }
  for (const auto& name : o.algos) plan.asked.push_back(comm::parse_algo(name, "--algo"));
  for (double b = static_cast<double>(o.min_bytes);
       b <= static_cast<double>(o.max_bytes) * (1 + 1e-9); b = std::max(b * o.factor, b + 1)) {
    plan.sizes.push_back(static_cast<int64_t>(b));
  }
  plan.sizes.insert(plan.sizes.end(), o.add_sizes.begin(), o.add_sizes.end());
  std::sort(plan.sizes.begin(), plan.sizes.end());
  plan.sizes.erase(std::unique(plan.sizes.begin(), plan.sizes.end()), plan.sizes.end());
  return plan;
}

namespace {

using comm::Algo;
using comm::Communicator;
using comm::DType;
using comm::Op;
using json = nlohmann::json;

// Compute threads beside the collectives (--late-peer). Each repeats a chunk
// of multiply-adds on registers, with no memory traffic, so what slows it is
// losing its core, not bandwidth; it counts the chunks it finishes.
class ComputeLoad {
 public:
  explicit ComputeLoad(int threads) : counts_(static_cast<size_t>(threads)) {
    for (auto& count : counts_) workers_.emplace_back([this, &count] { work(count); });
  }
  ~ComputeLoad() {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& t : workers_) t.join();
  }
  ComputeLoad(const ComputeLoad&) = delete;
  ComputeLoad& operator=(const ComputeLoad&) = delete;

  // Chunks finished so far, all threads.
  double chunks() const {
    uint64_t n = 0;
    for (const auto& count : counts_) n += count.n.load(std::memory_order_relaxed);
    return static_cast<double>(n);
  }

 private:
  struct alignas(64) Count {  // one cache line per thread: no sharing between them
    std::atomic<uint64_t> n{0};
  };
  void work(Count& count) {
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    while (!stop_.load(std::memory_order_relaxed)) {
      for (int i = 0; i < 16384; ++i) {
        for (float& v : x) v = v * 0.9999f + 1e-4f;
      }
      count.n.fetch_add(1, std::memory_order_relaxed);
    }
    float sum = 0;
    for (float v : x) sum += v;
    sink_.store(sum, std::memory_order_relaxed);  // keeps the arithmetic
  }

  std::vector<Count> counts_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<float> sink_{0};
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// --late-peer sums over timed iterations, each a compute-chunk count and
// the seconds it took. Per rank: the late call's window (barrier to return;
// rank 0 waits in it), the reference's sleep as long as the lateness, and
// the whole reference (that sleep, then the same call with every rank on
// time). Rank 0 alone adds its call thread's CPU seconds and call seconds
// (the others add 0), so summing over ranks keeps rank 0's.
struct LateSums {
  // Seconds and chunks of the late calls' windows, of the reference sleeps
  // and of the whole references (sleep, then the call on time); rank 0's
  // call thread's CPU seconds and call seconds.
  enum Field {
    late_s,
    late_chunks,
    sleep_s,
    sleep_chunks,
    ref_s,
    ref_chunks,
    cpu0_s,
    call0_s,
    kFields
  };
  std::array<double, kFields> v{};
  double& operator[](Field f) { return v[f]; }
  double operator[](Field f) const { return v[f]; }

  void add(const LateSums& o) {
    for (size_t i = 0; i < v.size(); ++i) v[i] += o.v[i];
  }
  void sum_over_ranks(MPI_Comm comm) {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), kFields, MPI_DOUBLE, MPI_SUM, comm);
  }
  // NaN where nothing was measured: null in the JSON, "-" in the tables.
  double wait_cpu() const { return v[call0_s] > 0 ? v[cpu0_s] / v[call0_s] : std::nan(""); }
  // 1 - the compute rate over the late calls' windows / over a reference's.
  double slowdown(Field chunks, Field seconds) const {
    if (!(v[late_s] > 0 && v[seconds] > 0 && v[chunks] > 0)) return std::nan("");
    return 1.0 - (v[late_chunks] / v[late_s]) / (v[chunks] / v[seconds]);
  }
  double compute_slowdown() const { return slowdown(sleep_chunks, sleep_s); }
  double wait_slowdown() const { return slowdown(ref_chunks, ref_s); }
};

// One op's measurement: its spec, the algorithms measured, the options.
class OpBench {
 public:
  OpBench(Communicator& c, const CommBenchOptions& o, const CommPlan& plan,
          const CollectiveSpec& spec, const ComputeLoad* load)
      : c_(c), o_(o), plan_(plan), spec_(spec), load_(load) {
    // mpi first (the baseline), then the others registered for the op.
    algos_ = {Algo::mpi};
    for (Algo a : comm::algorithms_for(spec.op)) {
      if (a == Algo::mpi) continue;
      if (!plan.asked.empty() &&
          std::find(plan.asked.begin(), plan.asked.end(), a) == plan.asked.end())
        continue;
      if (a == Algo::shm && !c.single_node()) continue;  // hier handles several nodes
      algos_.push_back(a);
    }
    // Shared-memory setup is collective and slow-ish: not part of any timing.
    if (std::find(algos_.begin(), algos_.end(), Algo::shm) != algos_.end()) c.shm();
  }

  // The sweep, refined where time per byte steps up, then the fits.
  void run(CommBenchResult& result) const;

 private:
  // Appends a point per size of `sweep` and algorithm, each size's samples
  // pooled over o.passes sweeps: a slow spell of the machine (another
  // tenant, the other core busy) lands on every size alike instead of on
  // the few it happened to cover.
  void measure(const std::vector<int64_t>& sweep, std::vector<CommPoint>& out) const;
  // This rank's seconds for each of the o.iters timed calls, after o.warmup
  // untimed ones. Under --late-peer each call follows a reference sleep as
  // long as the lateness, and `late` gathers both windows' compute.
  std::vector<double> time_iterations(const CommCase& k, Algo a, LateSums& late) const;
  // Clears recv, fills the inputs with the pattern, runs once, counts wrong
  // elements (all ranks summed).
  int64_t check(const CommCase& k, Algo a, unsigned char* recv, size_t recv_bytes) const;
  size_t peers() const { return spec_.per_peer ? static_cast<size_t>(c_.size()) : 1; }

  Communicator& c_;
  const CommBenchOptions& o_;
  const CommPlan& plan_;
  const CollectiveSpec& spec_;
  const ComputeLoad* load_;  // --late-peer only
  std::vector<Algo> algos_;
};

std::vector<double> OpBench::time_iterations(const CommCase& k, Algo a, LateSums& late) const {
  const auto lateness = std::chrono::duration<double, std::milli>(o_.late_peer_ms);
  std::vector<double> block;
  for (int it = 0; it < o_.warmup + o_.iters; ++it) {
    const bool timed = it >= o_.warmup;
    if (load_ && timed) {
      // The reference: a sleep as long as the lateness, then the call with
      // every rank on time.
      c_.barrier();
      const double w0 = load_->chunks(), s0 = now_seconds();
      std::this_thread::sleep_for(lateness);
      const double w1 = load_->chunks(), s1 = now_seconds();
      spec_.run(k, a);
      late[LateSums::sleep_s] += s1 - s0;
      late[LateSums::sleep_chunks] += w1 - w0;
      late[LateSums::ref_s] += now_seconds() - s0;
      late[LateSums::ref_chunks] += load_->chunks() - w0;
    }
    c_.barrier();
    if (c_.rank() == o_.stall_rank && a == algos_.back()) {
      // A hung rank in the last algorithm measured (the one --algo names):
      // the others must end within --timeout, naming the op.
      std::this_thread::sleep_for(std::chrono::duration<double>(3 * o_.timeout_s + 10));
    }
    const double w0 = load_ ? load_->chunks() : 0, window0 = now_seconds();
    if (load_ && c_.rank() != 0) std::this_thread::sleep_for(lateness);
    const double cpu0 = load_ ? thread_cpu_seconds() : 0;
    const double t0 = now_seconds();
    spec_.run(k, a);
    const double t1 = now_seconds();
    if (!timed) continue;
    block.push_back(t1 - t0);
    if (load_) {
      late[LateSums::late_s] += t1 - window0;
      late[LateSums::late_chunks] += load_->chunks() - w0;
      if (c_.rank() == 0) {
        late[LateSums::cpu0_s] += thread_cpu_seconds() - cpu0;
        late[LateSums::call0_s] += t1 - t0;
      }
    }
  }
  return block;
}

int64_t OpBench::check(const CommCase& k, Algo a, unsigned char* recv, size_t recv_bytes) const {
  std::fill(recv, recv + recv_bytes, 0);
  spec_.fill(k);
  spec_.run(k, a);
  int64_t wrong = spec_.wrong(k), total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, c_.mpi_comm());
  return total;
}

void OpBench::measure(const std::vector<int64_t>& sweep, std::vector<CommPoint>& out) const {
  const size_t es = comm::size_of(plan_.dtype);
  std::vector<std::vector<double>> times(sweep.size() * algos_.size());
  std::vector<LateSums> lates(times.size());
  const size_t steps = static_cast<size_t>(o_.passes) * times.size();
  size_t step = 0;
  const bool report = o_.progress && c_.rank() == 0;
  for (int pass = 0; pass < o_.passes; ++pass) {
    const bool last = pass + 1 == o_.passes;
    for (size_t si = 0; si < sweep.size(); ++si) {
      // nccl-tests sizing: bytes is the whole message (all-to-all: all one rank sends).
      const size_t count = static_cast<size_t>(sweep[si]) / es / peers();
      const size_t total = count * peers();
      const size_t bytes = total * es + 64;
      std::vector<unsigned char> plain_send, plain_recv;
      SharedBuffer shared_send, shared_recv;
      unsigned char *send = nullptr, *recv = nullptr;
      if (o_.registered) {
        shared_send = SharedBuffer(bytes, "bench comm send");
        shared_recv = SharedBuffer(bytes, "bench comm recv");
        send = shared_send.data();
        recv = shared_recv.data();
      } else {
        plain_send.assign(bytes, 0);
        plain_recv.assign(bytes, 0);
        send = plain_send.data();
        recv = plain_recv.data();
      }
      const CommCase k{c_, send, recv, count, plan_.dtype, plan_.redop, o_.root, o_.in_place};
      for (size_t ai = 0; ai < algos_.size(); ++ai) {
        progress_line(report, step++, steps,
                      comm::to_string(spec_.op) + " " + std::to_string(sweep[si]) + " B " +
                          comm::to_string(algos_[ai]) +
                          (o_.passes > 1 ? ", pass " + std::to_string(pass + 1) : ""));
        LateSums late;
        std::vector<double> block = time_iterations(k, algos_[ai], late);
        // Each iteration's time is its slowest rank's.
        MPI_Allreduce(MPI_IN_PLACE, block.data(), static_cast<int>(block.size()), MPI_DOUBLE,
                      MPI_MAX, c_.mpi_comm());
        auto& all = times[si * algos_.size() + ai];
        all.insert(all.end(), block.begin(), block.end());
        LateSums& pooled = lates[si * algos_.size() + ai];
        if (load_) {
          late.sum_over_ranks(c_.mpi_comm());
          pooled.add(late);
        }
        if (!last) continue;
        Samples s{all};
        CommPoint p;
        p.op = comm::to_string(spec_.op);
        p.algo = comm::to_string(algos_[ai]);
        p.bytes = static_cast<int64_t>(total * es);
        p.count = static_cast<int64_t>(count);
        p.p50_us = s.median() * 1e6;
        p.p99_us = s.percentile(99) * 1e6;
        p.algbw = p.p50_us > 0 ? static_cast<double>(p.bytes) / (p.p50_us * 1e-6) / 1e9 : 0;
        p.busbw = p.algbw * spec_.bus_factor(c_.size());
        p.wrong = o_.check ? check(k, algos_[ai], recv, bytes) : -1;
        if (load_) {
          p.wait_cpu = pooled.wait_cpu();
          p.compute_slowdown = pooled.compute_slowdown();
          p.wait_slowdown = pooled.wait_slowdown();
        }
        out.push_back(p);
      }
    }
  }
}

void OpBench::run(CommBenchResult& result) const {
  const size_t first = result.points.size();
  measure(plan_.sizes, result.points);
  if (o_.refine > 1.0) {
    // Every rank holds the same (slowest-rank) times, so every rank picks
    // the same sizes. Two rounds: a step still sharp inside a third is cut
    // again; an interval narrower than kMinRefineStep is left alone.
    std::vector<CommPoint> seen(result.points.begin() + static_cast<long>(first),
                                result.points.end());
    const int64_t granule = static_cast<int64_t>(comm::size_of(plan_.dtype) * peers());
    for (int round = 0; round < 2; ++round) {
      const auto extra = refine_sizes(seen, comm::to_string(spec_.op), o_.refine, granule);
      if (extra.empty()) break;
      const size_t before = result.points.size();
      measure(extra, result.points);
      seen.insert(seen.end(), result.points.begin() + static_cast<long>(before),
                  result.points.end());
    }
    // Sizes in order again, each size's algorithms in their measured order.
    std::stable_sort(result.points.begin() + static_cast<long>(first), result.points.end(),
                     [](const CommPoint& x, const CommPoint& y) { return x.bytes < y.bytes; });
  }
  for (Algo a : algos_) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& p : result.points) {
      if (p.op == comm::to_string(spec_.op) && p.algo == comm::to_string(a) && p.bytes > 0) {
        pts.push_back({static_cast<double>(p.bytes), p.p50_us * 1e-6});
      }
    }
    AlphaBeta ab = fit_alpha_beta(pts);
    ab.op = comm::to_string(spec_.op);
    ab.algo = comm::to_string(a);
    result.fits.push_back(ab);
  }
}

}  // namespace

double bus_factor(Op op, int n) {
  return spec_for(op).bus_factor(n);
}

comm::TuningTable tuning_from(const CommBenchResult& result) {
  comm::TuningTable table;
  std::vector<std::string> ops;
  for (const auto& p : result.points) {
    if (std::find(ops.begin(), ops.end(), p.op) == ops.end()) ops.push_back(p.op);
  }
  for (const auto& op_name : ops) {
    const Op op = comm::parse_op(op_name, "op");
    std::vector<int64_t> sizes;
    for (const auto& p : result.points) {
      if (p.op == op_name && std::find(sizes.begin(), sizes.end(), p.bytes) == sizes.end())
        sizes.push_back(p.bytes);
    }
    std::sort(sizes.begin(), sizes.end());
    for (int64_t bytes : sizes) {
      const CommPoint* best = nullptr;
      for (const auto& p : result.points) {
        if (p.op != op_name || p.bytes != bytes || p.algo == "auto" || p.wrong > 0) continue;
        if (!best || p.p50_us < best->p50_us) best = &p;
      }
      if (!best) continue;
      const Algo a = comm::parse_algo(best->algo, "algo");
      if (!table.rows.empty() && table.rows.back().op == op && table.rows.back().algo == a) {
        table.rows.back().max_bytes = bytes;
      } else {
        table.rows.push_back({op, result.ranks, bytes, a});
      }
    }
    if (!table.rows.empty() && table.rows.back().op == op) {
      table.rows.back().max_bytes = std::numeric_limits<int64_t>::max();
    }
  }
  return table;
}

AlphaBeta fit_alpha_beta(const std::vector<std::pair<double, double>>& pts) {
  // Minimise sum w (alpha + beta x - y)^2 with w = 1/y^2.
  double sw = 0, swx = 0, swy = 0, swxx = 0, swxy = 0;
  for (const auto& [x, y] : pts) {
    if (!(y > 0)) continue;
    const double w = 1.0 / (y * y);
    sw += w;
    swx += w * x;
    swy += w * y;
    swxx += w * x * x;
    swxy += w * x * y;
  }
  AlphaBeta ab;
  const double det = sw * swxx - swx * swx;
  if (pts.size() < 2 || std::abs(det) < 1e-300) return ab;
  double beta = (sw * swxy - swx * swy) / det;
  double alpha = (swy - beta * swx) / sw;
  if (alpha < 0) {  // no negative latency: refit through the origin
    alpha = 0;
    beta = swxy / swxx;
  }
  ab.alpha_us = alpha * 1e6;
  ab.bandwidth_gbs = beta > 0 ? 1.0 / beta / 1e9 : 0;
  return ab;
}

std::vector<int64_t> refine_sizes(const std::vector<CommPoint>& points, const std::string& op,
                                  double threshold, int64_t granule) {
  std::vector<int64_t> sizes;
  std::vector<std::string> algos;
  for (const auto& p : points) {
    if (p.op != op || p.bytes <= 0) continue;
    sizes.push_back(p.bytes);
    if (std::find(algos.begin(), algos.end(), p.algo) == algos.end()) algos.push_back(p.algo);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  auto per_byte = [&](const std::string& algo, int64_t bytes) {
    for (const auto& p : points) {
      if (p.op == op && p.algo == algo && p.bytes == bytes && p.p50_us > 0)
        return p.p50_us / static_cast<double>(bytes);
    }
    return 0.0;
  };
  std::vector<int64_t> out;
  granule = std::max<int64_t>(granule, 1);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    const double a = static_cast<double>(sizes[i]), b = static_cast<double>(sizes[i + 1]);
    if (b / a < kMinRefineStep) continue;
    bool step = false;
    for (const auto& algo : algos) {
      const double ta = per_byte(algo, sizes[i]), tb = per_byte(algo, sizes[i + 1]);
      step = step || (ta > 0 && tb > 0 && tb / ta > threshold);
    }
    if (!step) continue;
    for (double frac : {1.0 / 3.0, 2.0 / 3.0}) {
      const int64_t x = static_cast<int64_t>(a * std::pow(b / a, frac)) / granule * granule;
      if (x > sizes[i] && x < sizes[i + 1]) out.push_back(x);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void add_to_profile(const CommBenchResult& result, plan::HwProfile& profile) {
  json& entry = profile.comm["ranks"][std::to_string(result.ranks)];
  for (const auto& f : result.fits) {
    if (!(f.bandwidth_gbs > 0)) continue;  // no fit (one size, or no slope): nothing to price
    json points = json::array();
    for (const auto& p : result.points) {
      if (p.op == f.op && p.algo == f.algo && p.bytes > 0) points.push_back({p.bytes, p.p50_us});
    }
    entry[f.op][f.algo] = {
        {"alpha_us", f.alpha_us}, {"bandwidth_gbs", f.bandwidth_gbs}, {"points", points}};
  }
}

CommBenchResult run_comm_bench(Communicator& c, const CommBenchOptions& o) {
  const CommPlan plan = comm_plan(o, c.size());
  c.set_timeout(o.timeout_s);
  if (o.stall_rank >= c.size()) {
    throw InputError("--stall-rank: expected 0.." + std::to_string(c.size() - 1) + ", got " +
                     std::to_string(o.stall_rank));
  }
  if (!(o.late_peer_ms >= 0 && o.late_peer_ms <= 10000)) {
    throw InputError("--late-peer: expected 0..10000 ms, got " + std::to_string(o.late_peer_ms));
  }
  std::optional<ComputeLoad> load;
  int compute_threads = 0;
  if (o.late_peer_ms > 0) {
    if (c.size() < 2)
      throw InputError("--late-peer: expected >= 2 ranks (ranks 1.. are the late ones), got 1");
    if (!c.single_node()) {
      throw InputError(
          "--late-peer: expected the ranks on one node (the compute threads share its cores)");
    }
    compute_threads = std::max(1, cpu_info().logical_cpus / c.size());
    load.emplace(compute_threads);
  }
  CommBenchResult result;
  result.ranks = c.size();
  result.dtype = o.dtype;
  result.redop = o.redop;
  result.root = o.root;
  result.in_place = o.in_place;
  result.registered = o.registered;
  result.late_peer_ms = o.late_peer_ms;
  result.compute_threads = compute_threads;
  for (const CollectiveSpec* spec : plan.specs)
    OpBench(c, o, plan, *spec, load ? &*load : nullptr).run(result);
  return result;
}

json CommBenchResult::to_json() const {
  json j = {{"benchmark", "comm"},
            {"ranks", ranks},
            {"dtype", dtype},
            {"redop", redop},
            {"root", root},
            {"in_place", in_place},
            {"registered", registered},
            {"points", json::array()},
            {"fits", json::array()}};
  const bool late = late_peer_ms > 0;
  if (late) {
    j["late_peer_ms"] = late_peer_ms;
    j["compute_threads"] = compute_threads;
  }
  for (const auto& p : points) {
    json point = {{"op", p.op},
                  {"algo", p.algo},
                  {"bytes", p.bytes},
                  {"count", p.count},
                  {"p50_us", p.p50_us},
                  {"p99_us", p.p99_us},
                  {"algbw_gbs", p.algbw},
                  {"busbw_gbs", p.busbw},
                  {"wrong", p.wrong < 0 ? json() : json(p.wrong)}};  // null: --no-check
    if (late) {
      point["wait_cpu"] = p.wait_cpu;
      point["compute_slowdown"] = p.compute_slowdown;
      point["wait_slowdown"] = p.wait_slowdown;
    }
    j["points"].push_back(point);
  }
  for (const auto& f : fits) {
    const bool fitted = f.bandwidth_gbs > 0;  // two sizes or more, a positive slope
    j["fits"].push_back({{"op", f.op},
                         {"algo", f.algo},
                         {"alpha_us", fitted ? json(f.alpha_us) : json()},
                         {"bandwidth_gbs", fitted ? json(f.bandwidth_gbs) : json()}});
  }
  return j;
}

std::vector<std::pair<std::string, Table>> CommBenchResult::tables() const {
  std::vector<std::pair<std::string, Table>> out;
  std::vector<std::string> ops;
  for (const auto& p : points) {
    if (std::find(ops.begin(), ops.end(), p.op) == ops.end()) ops.push_back(p.op);
  }
  for (const auto& op : ops) {
    std::vector<std::string> algos;
    for (const auto& p : points) {
      if (p.op == op && std::find(algos.begin(), algos.end(), p.algo) == algos.end())
        algos.push_back(p.algo);
    }
    const bool late = late_peer_ms > 0;
    std::vector<std::string> cols = {"size", "count", "type", "redop", "root"};
    for (const auto& a : algos) {
      for (const char* c : {" p50 us", " p99 us", " algbw", " busbw", " #wrong"})
        cols.push_back(a + c);
      if (a != "mpi") cols.push_back(a + " x mpi");
      if (late) {
        cols.push_back(a + " wait cpu");
        cols.push_back(a + " slowdown");
        cols.push_back(a + " wait slowdown");
      }
    }
    Table table(cols);
    std::vector<int64_t> sizes;
    for (const auto& p : points) {
      if (p.op == op && std::find(sizes.begin(), sizes.end(), p.bytes) == sizes.end())
        sizes.push_back(p.bytes);
    }
    const CollectiveSpec& spec = spec_for(comm::parse_op(op, "op"));
    for (int64_t bytes : sizes) {
      std::vector<std::string> row;
      double mpi_busbw = 0;
      for (const auto& a : algos) {
        for (const auto& p : points) {
          if (p.op != op || p.bytes != bytes || p.algo != a) continue;
          if (row.empty()) {
            row = {std::to_string(p.bytes), std::to_string(p.count), dtype,
                   spec.reduces ? redop : "none", spec.rooted ? std::to_string(root) : "-"};
          }
          if (a == "mpi") mpi_busbw = p.busbw;
          row.push_back(fmt(p.p50_us, 1));
          row.push_back(fmt(p.p99_us, 1));
          row.push_back(fmt(p.algbw, 2));
          row.push_back(fmt(p.busbw, 2));
          row.push_back(p.wrong < 0 ? "-" : std::to_string(p.wrong));
          if (a != "mpi") row.push_back(mpi_busbw > 0 ? fmt(p.busbw / mpi_busbw, 2) : "-");
          if (late) {
            row.push_back(fmt(p.wait_cpu, 2));
            row.push_back(std::isnan(p.compute_slowdown) ? "-"
                                                         : fmt(100 * p.compute_slowdown, 1) + "%");
            row.push_back(std::isnan(p.wait_slowdown) ? "-" : fmt(100 * p.wait_slowdown, 1) + "%");
          }
        }
      }
      table.add_row(row);
    }
    out.push_back({op, table});
  }
  return out;
}

std::string CommBenchResult::text() const {
  std::ostringstream s;
  for (const auto& [op, table] : tables()) {
    s << "# " << op << ", " << ranks << " ranks, " << dtype
      << (in_place ? ", in place" : ", out of place") << (registered ? ", registered buffers" : "")
      << "; time = slowest rank, busbw in GB/s\n";
    if (late_peer_ms > 0) {
      s << "# ranks 1.. join " << fmt(late_peer_ms, 1) << " ms late (in the times); "
        << compute_threads
        << " compute thread(s) per rank; wait cpu = rank 0's CPU s per s in the call; the "
           "compute threads' rate lost against a sleep as long (slowdown) and against that "
           "sleep then the call on time (wait slowdown)\n";
    }
    s << table.to_text() << "\n";
  }
  s << "alpha-beta fit (time = alpha + bytes / bandwidth):\n";
  Table fit({"op", "algo", "alpha us", "bandwidth GB/s"});
  for (const auto& f : fits)
    fit.add_row({f.op, f.algo, fmt(f.alpha_us, 2), fmt(f.bandwidth_gbs, 2)});
  s << fit.to_text();
  return s.str();
}

std::string CommBenchResult::csv() const {
  const bool late = late_peer_ms > 0;
  std::vector<std::string> cols = {"op",   "algo",   "size",   "count", "type",  "redop",
                                   "root", "p50_us", "p99_us", "algbw", "busbw", "wrong"};
  if (late) cols.insert(cols.end(), {"wait_cpu", "compute_slowdown", "wait_slowdown"});
  Table t(cols);
  for (const auto& p : points) {
    // As the table: redop "none" where the op reduces nothing, root -1 where
    // it has none; wrong -1 where the check was off (the table's "-").
    const CollectiveSpec& spec = spec_for(comm::parse_op(p.op, "op"));
    std::vector<std::string> row = {p.op,
                                    p.algo,
                                    std::to_string(p.bytes),
                                    std::to_string(p.count),
                                    dtype,
                                    spec.reduces ? redop : "none",
                                    spec.rooted ? std::to_string(root) : "-",
                                    fmt(p.p50_us, 2),
                                    fmt(p.p99_us, 2),
                                    fmt(p.algbw, 3),
                                    fmt(p.busbw, 3),
                                    p.wrong < 0 ? "-" : std::to_string(p.wrong)};
    if (late) {
      row.insert(row.end(),
                 {fmt(p.wait_cpu, 3), fmt(p.compute_slowdown, 4), fmt(p.wait_slowdown, 4)});
    }
    t.add_row(row);
  }
  return t.to_csv();
}

}  // namespace anvil::bench
