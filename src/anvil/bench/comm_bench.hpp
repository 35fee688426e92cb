// `anvil bench comm`: collective microbenchmarks in the conventions of
// nccl-tests. Every algorithm of an op is timed at every size in the same
// run, interleaved size by size, next to the MPI library's own collective.
//
// Per size and algorithm: time p50/p99 over iterations (each iteration's
// time is the slowest rank's, ranks aligned by a barrier), algbw = bytes /
// p50, busbw = algbw x factor (all-reduce 2(n-1)/n; reduce-scatter,
// all-gather, all-to-all (n-1)/n; broadcast, reduce 1), #wrong from an
// exact check, and busbw relative to `mpi`. Bytes are nccl-tests' sizes:
// the whole vector (all-to-all: everything one rank sends).
// Then an alpha-beta fit per algorithm: time = alpha + bytes / bandwidth.
// What differs per collective (sizing, factor, check, call) is its spec in
// comm_specs.hpp; the sweep, timing, checking and output here serve all.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/table.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/plan/hw_profile.hpp"

namespace anvil::bench {

struct CommBenchOptions {
  int64_t min_bytes = 8;
  int64_t max_bytes = 64 << 20;
  double factor = 2.0;
  std::vector<std::string> ops = {"allreduce"};
  std::string dtype = "f32";
  std::string redop = "sum";
  std::vector<std::string> algos;  // empty: every algorithm of each op
  int iters = 20;
  int warmup = 5;
  int passes = 1;                  // sweeps over the sizes; each size's samples pool all of them
  std::vector<int64_t> add_sizes;  // measured besides the -b/-e/-f sweep
  // > 1: where an algorithm's time per byte rises by more than this between
  // two neighbouring sizes (a cache step), measure sizes inside (refine_sizes).
  double refine = 0;
  bool check = true;
  bool in_place = false;
  // Buffers in shared memory the peers can map (SharedBuffer), as
  // NCCL's registered buffers; every algorithm gets the same ones.
  bool registered = false;
  int root = 0;
  double timeout_s = 60;
  int stall_rank = -1;  // testing aid: this rank never joins the last algorithm's first call
  // > 0: ranks 1.. join every timed call this many milliseconds late while
  // compute threads run on every rank (max(1, logical CPUs / ranks) each):
  // what waiting costs the waiter's core and the compute beside it. One node.
  double late_peer_ms = 0;
  device::DeviceKind device = device::DeviceKind::cpu;  // cuda: NCCL (gpu_bench.hpp)
  bool progress = false;  // rank 0: measure.hpp's progress_line per size and algorithm
};

struct CommPoint {
  std::string op, algo;
  int64_t bytes = 0, count = 0;
  double p50_us = 0, p99_us = 0, algbw = 0, busbw = 0;  // GB/s
  int64_t wrong = -1;                                   // -1: not checked
  // --late-peer only (else -1). wait_cpu: rank 0's CPU seconds per second in
  // the call, most of it spent waiting for the late ranks. compute_slowdown:
  // 1 - the compute threads' rate over the late calls' windows (each rank's
  // from the barrier to its return) / their rate over a sleep as long as the
  // lateness, with no call; wait_slowdown: the same against that sleep
  // followed by the call with every rank on time (the waiting's own cost,
  // without the copying every call does).
  double wait_cpu = -1, compute_slowdown = -1, wait_slowdown = -1;
};

struct AlphaBeta {
  std::string op, algo;
  double alpha_us = 0, bandwidth_gbs = 0;
};

struct CommBenchResult {
  int ranks = 1;
  std::string dtype, redop;
  int root = 0;
  bool in_place = false;
  bool registered = false;
  double late_peer_ms = 0;  // > 0: wait_cpu and compute_slowdown are measured
  int compute_threads = 0;  // per rank, under --late-peer
  std::vector<CommPoint> points;
  std::vector<AlphaBeta> fits;
  nlohmann::json to_json() const;
  // One table per op.
  std::vector<std::pair<std::string, Table>> tables() const;
  std::string text() const;
  std::string csv() const;
};

// The spec's busbw / algbw for n ranks.
double bus_factor(comm::Op op, int n);

// The `auto` table from a run: per op and size the algorithm with the best
// busbw (auto itself excluded), adjacent sizes with the same winner merged,
// the last row covering every larger size.
comm::TuningTable tuning_from(const CommBenchResult& result);

struct CollectiveSpec;

// The options, checked (errors in the order of the flags; InputError) and
// parsed, for `ranks` ranks: the ops' specs, the algorithms asked for, and
// the sizes of the -b/-e/-f sweep with --add-sizes, sorted and unique.
struct CommPlan {
  comm::DType dtype;
  comm::ReduceOp redop;
  std::vector<const CollectiveSpec*> specs;
  std::vector<comm::Algo> asked;  // empty: every algorithm of each op
  std::vector<int64_t> sizes;
};
CommPlan comm_plan(const CommBenchOptions& options, int ranks);

// Collective over the communicator; every rank returns the same result.
CommBenchResult run_comm_bench(comm::Communicator& comm, const CommBenchOptions& options);

// Weighted least squares of time = alpha + bytes/bandwidth (weights 1/t^2:
// relative error counts the same at every size).
AlphaBeta fit_alpha_beta(const std::vector<std::pair<double, double>>& bytes_and_seconds);

// Adaptive sampling of a sweep. Log-log interpolation between two measured
// sizes can be off by up to sqrt(s) where time per byte steps up by s
// between them (buffers leaving a cache level), and a fixed grid cannot tell
// where inside the interval the step sits. For every pair of neighbouring
// sizes (a, b) of one op, b/a >= kMinRefineStep, where some algorithm's time
// per byte rises by more than `threshold` from a to b, this returns the two
// sizes a(b/a)^(1/3) and a(b/a)^(2/3), rounded down to `granule` bytes.
// Thirds, not halves: repeated refinement never lands on a geometric
// midpoint, which bench/plan_validation.sh holds out. Sorted, unique, none
// already measured.
inline constexpr double kMinRefineStep = 1.2;
std::vector<int64_t> refine_sizes(const std::vector<CommPoint>& points, const std::string& op,
                                  double threshold, int64_t granule);

// Records a run in a hardware profile under comm.ranks.<N>.<op>.<algo>: the
// alpha-beta fit and the measured median times ("points": [[bytes, us]...]),
// which the planner interpolates (docs/plan.md).
void add_to_profile(const CommBenchResult& result, plan::HwProfile& profile);

}  // namespace anvil::bench
