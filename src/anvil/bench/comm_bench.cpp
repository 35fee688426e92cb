#include "anvil/bench/comm_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

#include "anvil/base/error.hpp"
#include "anvil/bench/measure.hpp"
#include "anvil/comm/check.hpp"

namespace anvil::bench {
namespace {

using comm::Algo;
using comm::Communicator;
using comm::DType;
using comm::Op;
using json = nlohmann::json;

// Buffers for one (op, size): inputs filled with the check pattern.
struct Buffers {
  std::vector<unsigned char> send, recv;
};

// The elements a rank sends for `bytes` of an op (nccl-tests sizing).
size_t count_for(Op op, int64_t bytes, DType t, int n) {
  const size_t es = comm::size_of(t);
  if (op == Op::alltoall) return static_cast<size_t>(bytes) / es / static_cast<size_t>(n);
  return static_cast<size_t>(bytes) / es;
}

void fill(std::vector<unsigned char>& buf, size_t count, DType t, int rank) {
  for (size_t i = 0; i < count; ++i)
    comm::check::put(buf.data(), i, t, comm::check::value(rank, i));
}

// Runs one op once. `count`: total elements (alltoall: per peer).
void run_op(Communicator& c, Op op, Algo a, Buffers& b, size_t count, DType t, comm::ReduceOp rop,
            int root, bool in_place) {
  const size_t es = comm::size_of(t);
  const int n = c.size(), r = c.rank();
  void* send = b.send.data();
  switch (op) {
    case Op::allreduce:
      return c.allreduce(send, in_place ? send : b.recv.data(), count, t, rop, a);
    case Op::reduce_scatter: {
      void* recv = in_place ? b.send.data() + comm::block_offset(count, n, r) * es : b.recv.data();
      return c.reduce_scatter(send, recv, count, t, rop, a);
    }
    case Op::allgather: {
      const void* in =
          in_place ? b.recv.data() + comm::block_offset(count, n, r) * es : b.send.data();
      return c.allgather(in, b.recv.data(), count, t, a);
    }
    case Op::broadcast:
      return c.broadcast(send, count, t, root, a);
    case Op::reduce:
      return c.reduce(send, in_place ? send : b.recv.data(), count, t, rop, root, a);
    case Op::alltoall:
      return c.alltoall(send, in_place ? send : b.recv.data(), count, t, a);
  }
}

// Fills inputs with the pattern, runs once, counts wrong elements (all ranks summed).
int64_t check_op(Communicator& c, Op op, Algo a, Buffers& b, size_t count, DType t,
                 comm::ReduceOp rop, int root, bool in_place) {
  const size_t es = comm::size_of(t);
  const int n = c.size(), r = c.rank();
  std::fill(b.recv.begin(), b.recv.end(), 0);
  if (op == Op::allgather) {
    // Rank r contributes block r of the pattern vector of rank r.
    const size_t off = comm::block_offset(count, n, r), mine = comm::block_count(count, n, r);
    unsigned char* dst = in_place ? b.recv.data() + off * es : b.send.data();
    for (size_t i = 0; i < mine; ++i) comm::check::put(dst, i, t, comm::check::value(r, off + i));
  } else if (op == Op::broadcast) {
    fill(b.send, count, t, r == root ? root : root + 1);
  } else if (op == Op::alltoall) {
    for (int q = 0; q < n; ++q)
      for (size_t j = 0; j < count; ++j)
        comm::check::put(b.send.data(), static_cast<size_t>(q) * count + j, t,
                         comm::check::alltoall_value(r, q, j));
  } else {
    fill(b.send, count, t, r);
  }
  run_op(c, op, a, b, count, t, rop, root, in_place);
  int64_t wrong = 0;
  switch (op) {
    case Op::allreduce: {
      const void* res = in_place ? b.send.data() : b.recv.data();
      for (size_t i = 0; i < count; ++i)
        wrong += comm::check::get(res, i, t) != comm::check::expected(i, n, t, rop);
      break;
    }
    case Op::reduce: {
      if (r != root) break;
      const void* res = in_place ? b.send.data() : b.recv.data();
      for (size_t i = 0; i < count; ++i)
        wrong += comm::check::get(res, i, t) != comm::check::expected(i, n, t, rop);
      break;
    }
    case Op::reduce_scatter: {
      const size_t off = comm::block_offset(count, n, r), mine = comm::block_count(count, n, r);
      const unsigned char* res = in_place ? b.send.data() + off * es : b.recv.data();
      for (size_t i = 0; i < mine; ++i)
        wrong += comm::check::get(res, i, t) != comm::check::expected(off + i, n, t, rop);
      break;
    }
    case Op::allgather:
      for (int q = 0; q < n; ++q)
        for (size_t i = comm::block_offset(count, n, q);
             i < comm::block_offset(count, n, q) + comm::block_count(count, n, q); ++i)
          wrong += comm::check::get(b.recv.data(), i, t) != comm::check::value(q, i);
      break;
    case Op::broadcast:
      for (size_t i = 0; i < count; ++i)
        wrong += comm::check::get(b.send.data(), i, t) != comm::check::value(root, i);
      break;
    case Op::alltoall: {
      const void* res = in_place ? b.send.data() : b.recv.data();
      for (int q = 0; q < n; ++q)
        for (size_t j = 0; j < count; ++j)
          wrong += comm::check::get(res, static_cast<size_t>(q) * count + j, t) !=
                   comm::check::alltoall_value(q, r, j);
      break;
    }
  }
  int64_t total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, c.mpi_comm());
  return total;
}

}  // namespace

double bus_factor(Op op, int n) {
  switch (op) {
    case Op::allreduce:
      return 2.0 * (n - 1) / n;
    case Op::reduce_scatter:
    case Op::allgather:
    case Op::alltoall:
      return static_cast<double>(n - 1) / n;
    case Op::broadcast:
    case Op::reduce:
      return 1.0;
  }
  return 1.0;
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
    json points = json::array();
    for (const auto& p : result.points) {
      if (p.op == f.op && p.algo == f.algo && p.bytes > 0) points.push_back({p.bytes, p.p50_us});
    }
    entry[f.op][f.algo] = {
        {"alpha_us", f.alpha_us}, {"bandwidth_gbs", f.bandwidth_gbs}, {"points", points}};
  }
}

CommBenchResult run_comm_bench(Communicator& c, const CommBenchOptions& o) {
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
  if (o.root < 0 || o.root >= c.size()) {
    throw InputError("--root: expected 0.." + std::to_string(c.size() - 1) + ", got " +
                     std::to_string(o.root));
  }
  const DType t = comm::parse_dtype(o.dtype, "--dtype");
  const comm::ReduceOp rop = comm::parse_reduce_op(o.redop, "--redop");
  if (rop == comm::ReduceOp::avg && !comm::is_floating(t)) {
    throw InputError("--redop avg: needs a floating --dtype, got " + o.dtype);
  }
  std::vector<Op> ops;
  for (const auto& name : o.ops) {
    if (name == "all") {
      ops = {Op::allreduce, Op::reduce_scatter, Op::allgather,
             Op::broadcast, Op::reduce,         Op::alltoall};
      break;
    }
    ops.push_back(comm::parse_op(name, "--op"));
  }
  std::vector<Algo> asked;
  for (const auto& name : o.algos) asked.push_back(comm::parse_algo(name, "--algo"));
  c.set_timeout(o.timeout_s);
  if (o.stall_rank >= c.size()) {
    throw InputError("--stall-rank: expected 0.." + std::to_string(c.size() - 1) + ", got " +
                     std::to_string(o.stall_rank));
  }

  CommBenchResult result;
  result.ranks = c.size();
  result.dtype = o.dtype;
  result.redop = o.redop;
  result.root = o.root;
  result.in_place = o.in_place;
  const int n = c.size();
  const size_t es = comm::size_of(t);
  std::vector<int64_t> sizes;
  for (double b = static_cast<double>(o.min_bytes);
       b <= static_cast<double>(o.max_bytes) * (1 + 1e-9); b = std::max(b * o.factor, b + 1)) {
    sizes.push_back(static_cast<int64_t>(b));
  }
  sizes.insert(sizes.end(), o.add_sizes.begin(), o.add_sizes.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (Op op : ops) {
    // mpi first (the baseline), then the others that implement the op.
    std::vector<Algo> algos = {Algo::mpi};
    for (Algo a : comm::algorithms_for(op)) {
      if (a == Algo::mpi) continue;
      if (!asked.empty() && std::find(asked.begin(), asked.end(), a) == asked.end()) continue;
      if (a == Algo::shm && !c.single_node()) continue;  // hier handles several nodes
      algos.push_back(a);
    }
    // Shared-memory setup is collective and slow-ish: not part of any timing.
    if (std::find(algos.begin(), algos.end(), Algo::shm) != algos.end()) c.shm();
    // Each pass sweeps every size once; a size's samples pool all passes, so
    // a slow spell of the machine (another tenant, the other core busy)
    // lands on every size alike instead of on the few it happened to cover.
    auto measure = [&](const std::vector<int64_t>& sweep) {
      std::vector<std::vector<double>> times(sweep.size() * algos.size());
      for (int pass = 0; pass < o.passes; ++pass) {
        const bool last = pass + 1 == o.passes;
        for (size_t si = 0; si < sweep.size(); ++si) {
          const size_t count = count_for(op, sweep[si], t, n);
          const size_t total = op == Op::alltoall ? count * static_cast<size_t>(n) : count;
          Buffers b;
          b.send.assign(total * es + 64, 0);
          b.recv.assign(total * es + 64, 0);
          for (size_t ai = 0; ai < algos.size(); ++ai) {
            const Algo a = algos[ai];
            std::vector<double> block;
            for (int it = 0; it < o.warmup + o.iters; ++it) {
              c.barrier();
              if (c.rank() == o.stall_rank && a == algos.back()) {
                // A hung rank in the last algorithm measured (the one --algo names):
                // the others must end within --timeout, naming the op.
                std::this_thread::sleep_for(std::chrono::duration<double>(3 * o.timeout_s + 10));
              }
              const double t0 = now_seconds();
              run_op(c, op, a, b, count, t, rop, o.root, o.in_place);
              const double dt = now_seconds() - t0;
              if (it >= o.warmup) block.push_back(dt);
            }
            // Each iteration's time is its slowest rank's.
            MPI_Allreduce(MPI_IN_PLACE, block.data(), static_cast<int>(block.size()), MPI_DOUBLE,
                          MPI_MAX, c.mpi_comm());
            auto& all = times[si * algos.size() + ai];
            all.insert(all.end(), block.begin(), block.end());
            if (!last) continue;
            Samples s{all};
            CommPoint p;
            p.op = comm::to_string(op);
            p.algo = comm::to_string(a);
            p.bytes = static_cast<int64_t>(total * es);
            p.count = static_cast<int64_t>(count);
            p.p50_us = s.median() * 1e6;
            p.p99_us = s.percentile(99) * 1e6;
            p.algbw = p.p50_us > 0 ? static_cast<double>(p.bytes) / (p.p50_us * 1e-6) / 1e9 : 0;
            p.busbw = p.algbw * bus_factor(op, n);
            p.wrong = o.check ? check_op(c, op, a, b, count, t, rop, o.root, o.in_place) : -1;
            result.points.push_back(p);
          }
        }
      }
    };
    const size_t first = result.points.size();
    measure(sizes);
    if (o.refine > 1.0) {
      // Every rank holds the same (slowest-rank) times, so every rank picks
      // the same sizes. Two rounds: a step still sharp inside a third is cut
      // again; an interval narrower than kMinRefineStep is left alone.
      const std::vector<CommPoint> mine(result.points.begin() + static_cast<long>(first),
                                        result.points.end());
      std::vector<CommPoint> seen = mine;
      const int64_t granule = static_cast<int64_t>(es) * (op == Op::alltoall ? n : 1);
      for (int round = 0; round < 2; ++round) {
        const auto extra = refine_sizes(seen, comm::to_string(op), o.refine, granule);
        if (extra.empty()) break;
        const size_t before = result.points.size();
        measure(extra);
        seen.insert(seen.end(), result.points.begin() + static_cast<long>(before),
                    result.points.end());
      }
      // Sizes in order again, each size's algorithms in their measured order.
      std::stable_sort(result.points.begin() + static_cast<long>(first), result.points.end(),
                       [](const CommPoint& x, const CommPoint& y) { return x.bytes < y.bytes; });
    }
    for (Algo a : algos) {
      std::vector<std::pair<double, double>> pts;
      for (const auto& p : result.points) {
        if (p.op == comm::to_string(op) && p.algo == comm::to_string(a) && p.bytes > 0) {
          pts.push_back({static_cast<double>(p.bytes), p.p50_us * 1e-6});
        }
      }
      AlphaBeta ab = fit_alpha_beta(pts);
      ab.op = comm::to_string(op);
      ab.algo = comm::to_string(a);
      result.fits.push_back(ab);
    }
  }
  return result;
}

json CommBenchResult::to_json() const {
  json j = {{"benchmark", "comm"},     {"ranks", ranks},       {"dtype", dtype},
            {"redop", redop},          {"root", root},         {"in_place", in_place},
            {"points", json::array()}, {"fits", json::array()}};
  for (const auto& p : points) {
    j["points"].push_back({{"op", p.op},
                           {"algo", p.algo},
                           {"bytes", p.bytes},
                           {"count", p.count},
                           {"p50_us", p.p50_us},
                           {"p99_us", p.p99_us},
                           {"algbw_gbs", p.algbw},
                           {"busbw_gbs", p.busbw},
                           {"wrong", p.wrong}});
  }
  for (const auto& f : fits) {
    j["fits"].push_back({{"op", f.op},
                         {"algo", f.algo},
                         {"alpha_us", f.alpha_us},
                         {"bandwidth_gbs", f.bandwidth_gbs}});
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
    std::vector<std::string> cols = {"size", "count", "type", "redop", "root"};
    for (const auto& a : algos) {
      for (const char* c : {" p50 us", " p99 us", " algbw", " busbw", " #wrong"})
        cols.push_back(a + c);
      if (a != "mpi") cols.push_back(a + " x mpi");
    }
    Table table(cols);
    std::vector<int64_t> sizes;
    for (const auto& p : points) {
      if (p.op == op && std::find(sizes.begin(), sizes.end(), p.bytes) == sizes.end())
        sizes.push_back(p.bytes);
    }
    const bool reduces = op == "allreduce" || op == "reduce_scatter" || op == "reduce";
    const bool rooted = op == "broadcast" || op == "reduce";
    for (int64_t bytes : sizes) {
      std::vector<std::string> row;
      double mpi_busbw = 0;
      for (const auto& a : algos) {
        for (const auto& p : points) {
          if (p.op != op || p.bytes != bytes || p.algo != a) continue;
          if (row.empty()) {
            row = {std::to_string(p.bytes), std::to_string(p.count), dtype,
                   reduces ? redop : "none", rooted ? std::to_string(root) : "-1"};
          }
          if (a == "mpi") mpi_busbw = p.busbw;
          row.push_back(fmt(p.p50_us, 1));
          row.push_back(fmt(p.p99_us, 1));
          row.push_back(fmt(p.algbw, 2));
          row.push_back(fmt(p.busbw, 2));
          row.push_back(p.wrong < 0 ? "-" : std::to_string(p.wrong));
          if (a != "mpi") row.push_back(mpi_busbw > 0 ? fmt(p.busbw / mpi_busbw, 2) : "-");
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
      << (in_place ? ", in place" : ", out of place") << "; time = slowest rank, busbw in GB/s\n"
      << table.to_text() << "\n";
  }
  s << "alpha-beta fit (time = alpha + bytes / bandwidth):\n";
  Table fit({"op", "algo", "alpha us", "bandwidth GB/s"});
  for (const auto& f : fits)
    fit.add_row({f.op, f.algo, fmt(f.alpha_us, 2), fmt(f.bandwidth_gbs, 2)});
  s << fit.to_text();
  return s.str();
}

std::string CommBenchResult::csv() const {
  Table t({"op", "algo", "size", "count", "type", "redop", "root", "p50_us", "p99_us", "algbw",
           "busbw", "wrong"});
  for (const auto& p : points) {
    t.add_row({p.op, p.algo, std::to_string(p.bytes), std::to_string(p.count), dtype, redop,
               std::to_string(root), fmt(p.p50_us, 2), fmt(p.p99_us, 2), fmt(p.algbw, 3),
               fmt(p.busbw, 3), std::to_string(p.wrong)});
  }
  return t.to_csv();
}

}  // namespace anvil::bench
