// `bench comm --device cuda`: NCCL collectives, one GPU per rank, in the same
// points, tables and alpha-beta fits as the CPU sweep (algorithm "nccl").
// Inputs carry comm/check.hpp's exact patterns, filled on the host and
// copied up; results are copied back and compared element by element.
#include <algorithm>
#include <cmath>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/bench/comm_specs.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/comm/check.hpp"
#include "anvil/device/collectives.hpp"

namespace anvil::bench {
namespace {

using comm::Op;
using device::DeviceKind;

Dtype device_type(comm::DType t) {
  switch (t) {
    case comm::DType::f32:
      return Dtype::fp32;
    case comm::DType::bf16:
      return Dtype::bf16;
    case comm::DType::f64:
      return Dtype::fp64;
    case comm::DType::i32:
      return Dtype::int32;
    case comm::DType::i64:
      return Dtype::int64;
  }
  return Dtype::fp32;
}

device::ReduceOp device_op(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::sum:
      return device::ReduceOp::sum;
    case comm::ReduceOp::max:
      return device::ReduceOp::max;
    case comm::ReduceOp::min:
      return device::ReduceOp::min;
    case comm::ReduceOp::avg:
      return device::ReduceOp::avg;
  }
  return device::ReduceOp::sum;
}

// One (op, size) on the GPUs: host patterns, device buffers, the call.
struct GpuCase {
  Op op;
  size_t count = 0;  // elements of the whole message
  size_t per = 0;    // elements per rank block (reduce-scatter, all-gather, all-to-all)
  comm::DType type;
  comm::ReduceOp redop;
  int root = 0, rank = 0, world = 1;
  device::DeviceBuffer send, recv;
  std::vector<unsigned char> host_send, host_recv;

  size_t send_count() const {
    return op == Op::allgather ? per : count;
  }
  size_t recv_count() const {
    return op == Op::reduce_scatter ? per : count;
  }
};

void fill(GpuCase& c) {
  namespace ck = comm::check;
  const size_t n = c.send_count();
  c.host_send.assign(n * comm::size_of(c.type), 0);
  // Broadcast: only the root's input holds the pattern (the others' stay
  // zero), so a rank that kept its own input would be caught.
  if (c.op == Op::broadcast && c.rank != c.root) return;
  for (size_t i = 0; i < n; ++i) {
    double v = ck::value(c.rank, i);
    if (c.op == Op::allgather) v = ck::value(c.rank, c.rank * c.per + i);
    if (c.op == Op::broadcast) v = ck::value(c.root, i);
    if (c.op == Op::alltoall) v = ck::alltoall_value(c.rank, static_cast<int>(i / c.per), i % c.per);
    ck::put(c.host_send.data(), i, c.type, v);
  }
}

// How far NCCL's average may be from the exact one. NCCL averages floats
// as a sum of inputs each multiplied by 1/n first (ncclAvg's "pre-multiplied
// sum"): exact for n a power of two, within a few roundings of each term
// otherwise, so those get a tolerance of 2n units in the last place of the
// type at 2 (the averages are at most 2 in magnitude).
double avg_tolerance(comm::DType t, int world) {
  if ((world & (world - 1)) == 0) return 0;
  const double ulp = t == comm::DType::bf16  ? std::ldexp(1.0, -7)
                     : t == comm::DType::f32 ? std::ldexp(1.0, -23)
                                             : std::ldexp(1.0, -52);
  return 2.0 * world * ulp * 2.0;
}

int64_t wrong(const GpuCase& c) {
  namespace ck = comm::check;
  int64_t bad = 0;
  const size_t n = c.recv_count();
  const bool reduces = c.op == Op::allreduce || c.op == Op::reduce_scatter;
  const double tol = reduces && c.redop == comm::ReduceOp::avg ? avg_tolerance(c.type, c.world) : 0;
  for (size_t i = 0; i < n; ++i) {
    double want = 0;
    switch (c.op) {
      case Op::allreduce:
        want = ck::expected(i, c.world, c.type, c.redop);
        break;
      case Op::reduce_scatter:
        want = ck::expected(c.rank * c.per + i, c.world, c.type, c.redop);
        break;
      case Op::allgather:
        want = ck::value(static_cast<int>(i / c.per), i);
        break;
      case Op::broadcast:
        want = ck::value(c.root, i);
        break;
      case Op::alltoall:
        want = ck::alltoall_value(static_cast<int>(i / c.per), c.rank, i % c.per);
        break;
      default:
        break;
    }
    const double got = ck::get(c.host_recv.data(), i, c.type);
    bad += tol == 0 ? got != want : !(std::abs(got - want) <= tol);
  }
  return bad;
}

void call(device::DeviceCollectives& nccl, GpuCase& c, device::Stream& s) {
  const Dtype t = device_type(c.type);
  switch (c.op) {
    case Op::allreduce:
      nccl.all_reduce(c.send.data(), c.recv.data(), c.count, t, device_op(c.redop), s);
      break;
    case Op::reduce_scatter:
      nccl.reduce_scatter(c.send.data(), c.recv.data(), c.per, t, device_op(c.redop), s);
      break;
    case Op::allgather:
      nccl.all_gather(c.send.data(), c.recv.data(), c.per, t, s);
      break;
    case Op::broadcast:
      nccl.broadcast(c.send.data(), c.recv.data(), c.count, t, c.root, s);
      break;
    case Op::alltoall:
      nccl.all_to_all(c.send.data(), c.recv.data(), c.per, t, s);
      break;
    default:
      throw InputError("--op: " + comm::to_string(c.op) + " has no NCCL path in anvil");
  }
}

// Calls per timed sample: enough back-to-back calls to last ~1 ms (from one
// call's time after the warm-up), so a sample of small messages is not the
// event's resolution and the launch latency (nccl-tests' BenchTime times a
// batch of calls too). The same on every rank (the slowest rank's estimate).
int batch_calls(device::DeviceCollectives& nccl, GpuCase& c, device::Stream& stream,
                const GpuCommRuntime& rt) {
  device::Event start(DeviceKind::cuda), stop(DeviceKind::cuda);
  start.record(stream);
  call(nccl, c, stream);
  stop.record(stream);
  stop.synchronize();
  const double ms = rt.max_over_ranks(device::Event::elapsed_ms(start, stop));
  return static_cast<int>(std::clamp(std::ceil(1.0 / std::max(ms, 1e-4)), 1.0, 1000.0));
}

CommPoint measure(device::DeviceCollectives& nccl, GpuCase& c, device::Stream& stream,
                  const CommBenchOptions& o, const GpuCommRuntime& rt) {
  const size_t elem = comm::size_of(c.type);
  c.send = device::DeviceBuffer(DeviceKind::cuda, c.send_count() * elem, "comm send");
  c.recv = device::DeviceBuffer(DeviceKind::cuda, c.recv_count() * elem, "comm recv");
  CommPoint p{comm::to_string(c.op), "nccl", 0, 0, 0, 0, 0, 0, -1};
  p.bytes = static_cast<int64_t>(c.count * elem);
  p.count = static_cast<int64_t>(c.count);
  if (o.check) {
    fill(c);
    device::upload(c.host_send, c.send.data(), stream);
    // A fresh allocation can be the last size's block, holding a prefix of
    // the right answer: the output starts as zeros.
    device::upload(std::vector<unsigned char>(c.recv_count() * elem, 0), c.recv.data(), stream);
    call(nccl, c, stream);
    c.host_recv = device::download<unsigned char>(c.recv.data(), c.recv_count() * elem, stream);
    p.wrong = wrong(c);
  }
  for (int w = 0; w < o.warmup; ++w) call(nccl, c, stream);
  stream.synchronize();
  const int calls = batch_calls(nccl, c, stream, rt);
  device::Event start(DeviceKind::cuda), stop(DeviceKind::cuda);
  std::vector<double> us;
  for (int i = 0; i < o.iters * o.passes; ++i) {
    rt.max_over_ranks(0);  // all ranks start the batch together
    start.record(stream);
    for (int k = 0; k < calls; ++k) call(nccl, c, stream);
    stop.record(stream);
    stop.synchronize();
    us.push_back(rt.max_over_ranks(device::Event::elapsed_ms(start, stop) * 1e3 / calls));
  }
  std::sort(us.begin(), us.end());
  p.p50_us = us[us.size() / 2];
  p.p99_us = us[std::min(us.size() - 1, static_cast<size_t>(std::ceil(0.99 * us.size())) - 1)];
  p.algbw = static_cast<double>(p.bytes) / (p.p50_us * 1e-6) / 1e9;
  p.busbw = p.algbw * spec_for(c.op).bus_factor(c.world);
  return p;
}

}  // namespace

CommBenchResult run_comm_bench_gpu(const CommBenchOptions& o, const GpuCommRuntime& rt) {
  device::require(DeviceKind::cuda, "--device");
  const CommPlan plan = comm_plan(o, rt.world);  // the CPU sweep's checks and sizes
  const comm::DType type = plan.dtype;
  const comm::ReduceOp redop = plan.redop;
  std::vector<Op> ops;
  for (const auto& name : o.ops) {
    if (name == "all") {
      for (Op op : {Op::allreduce, Op::reduce_scatter, Op::allgather, Op::broadcast, Op::alltoall})
        ops.push_back(op);
    } else {
      ops.push_back(comm::parse_op(name, "--op"));
    }
  }
  device::DeviceCollectives nccl(rt.rank, rt.world, device::gpu_for_rank(rt.rank), rt.broadcast_id);
  device::Stream stream(DeviceKind::cuda);
  CommBenchResult result;
  result.ranks = rt.world;
  result.dtype = o.dtype;
  result.redop = o.redop;
  result.root = o.root;
  const size_t elem = comm::size_of(type);
  for (Op op : ops) {
    std::vector<std::pair<double, double>> fit_points;
    for (const int64_t b : plan.sizes) {
      GpuCase c{op, 0, 0, type, redop, o.root, rt.rank, rt.world, {}, {}, {}, {}};
      const size_t block = static_cast<size_t>(rt.world);
      c.count = std::max<size_t>(static_cast<size_t>(b) / elem / block, 1) * block;
      c.per = c.count / block;
      const CommPoint p = measure(nccl, c, stream, o, rt);
      fit_points.push_back({static_cast<double>(p.bytes), p.p50_us * 1e-6});
      result.points.push_back(p);
    }
    AlphaBeta fit = fit_alpha_beta(fit_points);
    fit.op = comm::to_string(op);
    fit.algo = "nccl";
    result.fits.push_back(fit);
  }
  return result;
}

}  // namespace anvil::bench
