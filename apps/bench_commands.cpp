// `anvil hw` and `anvil bench gemm | membw | attention | comm`: the machine
// described and measured, every figure next to the baseline measured in the
// same run. Tables by default, --json / --csv / --out for machines.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "anvil/bench/attention_bench.hpp"
#include "anvil/bench/comm_bench.hpp"
#include "anvil/bench/comm_specs.hpp"
#include "anvil/bench/gemm_bench.hpp"
#include "anvil/bench/hw_report.hpp"
#include "anvil/bench/membw_bench.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/comm/registry.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/bench/gpu_bench.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "cli.hpp"

namespace anvil::cli {
namespace {

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : ", ") + w;
  return s;
}

std::vector<std::string> with(std::vector<std::string> words, const std::string& more) {
  words.push_back(more);
  return words;
}

std::string blas_line() {
  const auto& b = device::blas_info();
  return "BLAS: " + b.corename + " kernels (" + b.reason + ")\n";
}

class BenchCommands : public CommandFamily {
 public:
  void add_to(CLI::App& app, Context&) override {
    hw_ = app.add_subcommand(
        "hw", "Describe this machine: CPU, ISA, caches, memory, BLAS, MPI, and its CUDA GPUs");
    hw_->add_flag("--json", hw_json_, "Print JSON instead of the table");
    hw_->add_option("--out", hw_out_, "Also write the JSON report to this file (atomically)")
        ->check(output_file());
    hw_->add_option("--profile", hw_profile_,
                    "Measure GEMM and memory bandwidth and write this machine's hardware profile "
                    "(JSON, see docs/hw-profile.md) to this file");
    add_device_option(hw_, hw_device_,
                      "Device --profile measures: cpu (this CPU) or cuda (GPU 0: cuBLASLt GEMM "
                      "grid, HBM bandwidth)");
    hw_->add_option("--min-time", hw_min_time_, "Seconds timed per measurement with --profile")
        ->check(in_range(0.001, 60))
        ->capture_default_str();
    auto* bench = app.add_subcommand("bench", "Microbenchmarks: gemm, membw, attention, comm");
    bench->require_subcommand(1);
    add_gemm(bench);
    add_membw(bench);
    add_attention(bench);
    add_comm(bench);
  }

  std::optional<int> run(Context& ctx) override {
    if (*hw_) return hw();
    if (*gemm_) return gemm();
    if (*membw_) {
      membw_options_.sizes = parse_sizes(membw_sizes_, "--sizes");
      membw_options_.progress = true;  // live on a terminal, else a line every 10 s
      membw_options_.device = device::parse_device(membw_device_, "--device");
      membw_out_.emit(bench::run_membw_bench(membw_options_), "");
      return 0;
    }
    if (*attention_) {
      attention_options_.progress = true;
      const auto result = bench::run_attention_bench(attention_options_);
      char peak[160];
      std::snprintf(peak, sizeof peak, "%s peak (2048^3 %s, %d threads, same run): %.1f GFLOP/s\n",
                    result.dtype == "bf16" ? "bf16 GEMM" : "sgemm", result.dtype.c_str(),
                    result.threads, result.sgemm_peak_gflops);
      attention_out_.emit(result, peak);
      return 0;
    }
    if (*comm_) return comm(ctx);
    return std::nullopt;
  }

 private:
  void add_gemm(CLI::App* bench);
  void add_membw(CLI::App* bench);
  void add_attention(CLI::App* bench);
  void add_comm(CLI::App* bench);
  void add_comm_sizes(CLI::App* cmd);
  int hw();
  int gemm();
  int comm(Context& ctx);
  int comm_gpu(Context& ctx);
  void emit_comm(const bench::CommBenchResult& result, std::optional<plan::HwProfile>& profile);

  CLI::App *hw_ = nullptr, *gemm_ = nullptr, *membw_ = nullptr, *attention_ = nullptr,
           *comm_ = nullptr;
  bool hw_json_ = false;
  std::string hw_out_;
  std::string hw_profile_;
  double hw_min_time_ = 0.1;
  std::string hw_device_ = "cpu";
  bench::GemmBenchOptions gemm_options_;
  std::vector<std::string> gemm_sizes_;
  std::string gemm_profile_, internal_spec_;
  OutputFlags gemm_out_;
  std::string gemm_device_ = "cpu", membw_device_ = "cpu", comm_device_ = "cpu";
  bench::MembwOptions membw_options_;
  std::vector<std::string> membw_sizes_;
  OutputFlags membw_out_;
  bench::AttentionBenchOptions attention_options_;
  OutputFlags attention_out_;
  bench::CommBenchOptions comm_options_;
  std::string comm_min_ = "8", comm_max_ = "64M", comm_profile_, tuning_out_;
  std::vector<std::string> comm_add_sizes_;
  int comm_np_ = 0, ranks_per_node_ = 0;
  bool no_check_ = false;
  OutputFlags comm_out_;
};

void BenchCommands::add_gemm(CLI::App* bench) {
  gemm_ = bench->add_subcommand(
      "gemm", "GEMM throughput by shape, dtype and threads, with baselines from the same run");
  bench::GemmBenchOptions& g = gemm_options_;
  gemm_
      ->add_option("--preset", g.preset,
                   "square: n x n x n for each --sizes; aligned: sizes that are multiples of "
                   "exactly 1, 8, 16, 64, 128 above each base in --sizes; model: the GEMMs of one "
                   "layer of --config; grid: every m, n, k from --sizes (default "
                   "64,256,1024,4096) in the forward, dgrad and wgrad transpositions, up to 35 "
                   "GFLOP a GEMM (the efficiency surface anvil plan interpolates)")
      ->check(one_of({"square", "aligned", "model", "grid"}))
      ->capture_default_str();
  gemm_
      ->add_option("--sizes", gemm_sizes_,
                   "Dimensions (square; default 128,256,512,1024,2048), base dimensions (aligned; "
                   "default 1024) or each dimension's values (grid)")
      ->delimiter(',');
  gemm_->add_option("--config", g.config_path, "Model config (JSON, configs/) for --preset model");
  gemm_->add_option("--set", g.overrides, "Override a config key: --set d_model=1024 (repeatable)");
  gemm_->add_option("--tokens", g.tokens, "Tokens per GEMM for --preset model (batch x sequence)")
      ->check(at_least(1))
      ->capture_default_str();
  gemm_
      ->add_option("--tokens-per-expert", g.tokens_per_expert,
                   "Tokens per expert GEMM (0: tokens x top_k / experts)")
      ->check(at_least(0))
      ->capture_default_str();
  gemm_->add_flag("--backward", g.backward, "Also measure each GEMM's dgrad and wgrad");
  add_dtype_list(gemm_, "--dtype", g.dtypes,
                 {Dtype::fp32, Dtype::bf16, Dtype::tf32, Dtype::fp16, Dtype::fp8},
                 "Input dtypes, fp32 accumulation; tf32, fp16 and fp8 with --device cuda",
                 profile_word);
  gemm_->add_option("--threads", g.threads, "Thread counts to sweep, e.g. 1,2 (default: all cores)")
      ->delimiter(',')
      ->check(at_least(1));
  gemm_
      ->add_option("--baselines", g.baselines,
                   "Baselines measured in the same run: library (raw OpenBLAS, its own CPU "
                   "detection), env (raw OpenBLAS, inherited OPENBLAS_CORETYPE), coretype:NAME "
                   "(raw OpenBLAS with that core type, e.g. coretype:Prescott), openblas (OpenBLAS "
                   "in-process), onednn (oneDNN fp32), naive (reference loop, small shapes); or "
                   "none")
      ->delimiter(',')
      ->capture_default_str();
  gemm_
      ->add_option("--min-time", g.timing.min_seconds,
                   "Seconds timed per shape (median of the calls is reported)")
      ->check(in_range(0.001, 60))
      ->capture_default_str();
  gemm_
      ->add_option("--passes", g.passes,
                   "Sweep the shapes this many times (--min-time each pass) and pool each "
                   "shape's samples, so a slow spell of the machine hits every shape alike "
                   "(CPU; baselines on the last pass)")
      ->check(at_least(1))
      ->capture_default_str();
  gemm_->add_option("--profile", gemm_profile_,
                    "Record the measured shapes in this hardware profile (from anvil hw "
                    "--profile); anvil plan prices those GEMMs at the measured rate (grid: the "
                    "surface it interpolates every other shape from)");
  add_device_option(gemm_, gemm_device_,
                    "Where to multiply: cpu, or cuda (cuBLASLt on GPU 0; dtypes fp32, tf32, bf16, "
                    "fp16, fp8; baseline: the best of cuBLASLt's top --algos algorithms)");
  gemm_->add_option("--algos", g.algos,
                    "--device cuda: heuristic algorithms timed per shape for the best-algo column")
      ->check(in_range(1, 64))
      ->capture_default_str();
  gemm_out_.add_to(gemm_);
  gemm_->add_option("--internal-raw-blas", internal_spec_, "(internal: baseline child)")->group("");
}

void BenchCommands::add_membw(CLI::App* bench) {
  membw_ = bench->add_subcommand(
      "membw", "Memory bandwidth (STREAM copy/scale/add/triad, read, write) from L1 to DRAM");
  bench::MembwOptions& m = membw_options_;
  membw_->add_option("--kernels", m.kernels, "Kernels: copy, scale, add, triad, read, write")
      ->delimiter(',')
      ->check(one_of({"copy", "scale", "add", "triad", "read", "write"}))
      ->capture_default_str();
  membw_
      ->add_option("--sizes", membw_sizes_,
                   "Working-set sizes (all arrays of a kernel), e.g. 32K,1M,1G (default 16K to 1G "
                   "by 4x)")
      ->delimiter(',');
  membw_->add_option("--threads", m.threads, "Thread counts, e.g. 1,2 (default 1..all cores)")
      ->delimiter(',')
      ->check(at_least(1));
  membw_->add_option("--min-time", m.min_seconds, "Seconds timed per (kernel, size, threads)")
      ->check(in_range(0.001, 60))
      ->capture_default_str();
  add_device_option(membw_, membw_device_,
                    "Where: cpu, or cuda (GPU 0's memory; default sizes 4 MiB (L2) .. 4 GiB (HBM))");
  membw_out_.add_to(membw_);
}

void BenchCommands::add_attention(CLI::App* bench) {
  attention_ = bench->add_subcommand(
      "attention",
      "The trainer's causal attention (forward, backward) by sequence length and head size, "
      "against the sgemm peak measured in the same run");
  bench::AttentionBenchOptions& a = attention_options_;
  attention_->add_option("--seqs", a.seqs, "Sequence lengths, e.g. 256,2048")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  attention_->add_option("--head-dims", a.head_dims, "Head sizes, e.g. 64,128")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  attention_->add_option("--heads", a.heads, "Query heads")
      ->check(at_least(1))
      ->capture_default_str();
  attention_->add_option("--kv-heads", a.kv_heads, "Key/value heads (GQA; 0: --heads)")
      ->check(at_least(0))
      ->capture_default_str();
  attention_->add_option("--tokens", a.tokens, "Tokens per call (batch = tokens / seq, at least 1)")
      ->check(at_least(1))
      ->capture_default_str();
  attention_->add_option("--threads", a.threads, "Threads (0: all cores)")
      ->check(at_least(0))
      ->capture_default_str();
  attention_->add_option("--min-time", a.min_seconds, "Seconds timed per case and pass")
      ->check(in_range(0.001, 60))
      ->capture_default_str();
  attention_
      ->add_option("--dtype", a.dtype,
                   "fp32, or bf16: the tiles a bf16 run takes (AVX512_BF16), against the "
                   "bf16 GEMM peak")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  attention_out_.add_to(attention_);
}

void BenchCommands::add_comm(CLI::App* bench) {
  comm_ = bench->add_subcommand(
      "comm",
      "Collectives (allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall) by size "
      "and algorithm, against MPI's own; run under mpirun or with --np");
  bench::CommBenchOptions& c = comm_options_;
  add_comm_sizes(comm_);
  // The collectives and algorithms are the registered ones (bench/comm_specs.hpp,
  // comm/registry.hpp): a new one needs no change here.
  std::vector<std::string> ops, algos;
  for (const auto& spec : bench::collective_specs()) ops.push_back(comm::to_string(spec.op));
  for (const auto& a : comm::registered_algorithms())
    if (std::find(algos.begin(), algos.end(), a.name) == algos.end()) algos.push_back(a.name);
  comm_->add_option("--op", c.ops, "Ops: " + join(ops) + ", or all")
      ->delimiter(',')
      ->check(one_of(with(ops, "all")))
      ->capture_default_str();
  add_dtype_option(comm_, "--dtype", c.dtype,
                   {Dtype::fp32, Dtype::bf16, Dtype::fp64, Dtype::int32, Dtype::int64},
                   "Element type", profile_word);
  comm_->add_option("--redop", c.redop, "Reduction: sum, max, min, avg")
      ->check(one_of({"sum", "max", "min", "avg"}))
      ->capture_default_str();
  comm_
      ->add_option("--algo", c.algos,
                   "Algorithms to time next to mpi: " + join(algos) +
                       ", auto (default: all that implement the op)")
      ->delimiter(',')
      ->check(one_of(with(algos, "auto")));
  comm_->add_option("-n,--iters", c.iters, "Timed iterations per size")
      ->check(at_least(1))
      ->capture_default_str();
  comm_->add_option("-w,--warmup", c.warmup, "Untimed iterations per size")
      ->check(at_least(0))
      ->capture_default_str();
  comm_
      ->add_option("--passes", c.passes,
                   "Sweep the sizes this many times (-n and -w each pass) and pool each size's "
                   "samples, so a slow spell of the machine hits every size alike")
      ->check(at_least(1))
      ->capture_default_str();
  comm_->add_flag("--no-check", no_check_, "Skip the exact result check (#wrong shows -)");
  comm_->add_flag("--inplace", c.in_place, "In-place buffers (as NCCL defines them)");
  comm_->add_flag("--registered", c.registered,
                  "Buffers in shared memory the other ranks map (as NCCL's registered buffers): "
                  "shm all-gather and broadcast read them in place instead of by cross-memory "
                  "attach; every algorithm gets the same buffers");
  comm_->add_option("--root", c.root, "Root rank for broadcast and reduce")
      ->check(at_least(0))
      ->capture_default_str();
  comm_
      ->add_option("--timeout", c.timeout_s,
                   "Seconds before a stuck collective fails, naming the op, step and missing ranks")
      ->check(in_range(0.1, 86400))
      ->capture_default_str();
  comm_->add_option("--stall-rank", c.stall_rank,
                    "Testing aid: this rank never joins, so the others show the --timeout error "
                    "(op, step, missing ranks) and the job ends");
  comm_
      ->add_option("--late-peer", c.late_peer_ms,
                   "Ranks 1.. join every timed call this many ms late while compute threads run "
                   "on every rank (logical CPUs / ranks each): adds columns for rank 0's CPU use "
                   "while it waits and the compute threads' slowdown against as long a sleep "
                   "with no call; CPU collectives on one node, 0 = off")
      ->check(in_range(0.0, 10000.0))
      ->capture_default_str();
  comm_
      ->add_option("--ranks-per-node", ranks_per_node_,
                   "Simulate nodes of N consecutive ranks for --algo hier (0: real nodes)")
      ->check(at_least(0))
      ->capture_default_str();
  comm_
      ->add_option("--tuning-out", tuning_out_,
                   "Write the table --algo auto uses (fastest algorithm per op and size; load it "
                   "with ANVIL_COMM_TUNING=FILE)")
      ->check(output_file());
  comm_->add_option("--np", comm_np_, "Launch N ranks with mpirun (when not already under mpirun)")
      ->check(in_range(1, 1024));
  comm_->add_option(
      "--profile", comm_profile_,
      "Write the alpha-beta fits into this hardware profile (from anvil hw --profile)");
  add_device_option(comm_, comm_device_,
                    "Where: cpu (anvil's collectives and MPI), or cuda (NCCL, one GPU per rank; "
                    "ops allreduce, reduce_scatter, allgather, broadcast, alltoall)");
  comm_out_.add_to(comm_);
}

void BenchCommands::add_comm_sizes(CLI::App* cmd) {
  bench::CommBenchOptions& c = comm_options_;
  cmd->add_option("-b,--minbytes", comm_min_, "Smallest message, e.g. 8, 1K, 1M")
      ->capture_default_str();
  cmd->add_option("-e,--maxbytes", comm_max_, "Largest message, e.g. 64M, 256M")
      ->capture_default_str();
  cmd->add_option("-f,--stepfactor", c.factor, "Size multiplier between steps")
      ->check(in_range(1.001, 1024))
      ->capture_default_str();
  cmd->add_option("--add-sizes", comm_add_sizes_,
                  "Sizes to measure besides the -b/-e/-f sweep, e.g. 20M,25M (a profile's refined "
                  "sizes, measured again)")
      ->delimiter(',');
  cmd->add_option("--refine", c.refine,
                  "Adaptive sweep: where an algorithm's time per byte rises more than this ratio "
                  "between neighbouring sizes (a cache step), also measure the sizes at 1/3 and "
                  "2/3 of the interval (log scale), twice over; 0 = off")
      ->capture_default_str();
}

int BenchCommands::hw() {
  if (!hw_profile_.empty()) {
    bench::ProfileOptions po;
    po.min_seconds = hw_min_time_;
    po.progress = true;
    const bool gpu = device::parse_device(hw_device_, "--device") == device::DeviceKind::cuda;
    if (gpu) device::require(device::DeviceKind::cuda, "--device");
    plan::save_hw_profile(gpu ? bench::measure_gpu_profile(po) : bench::measure_local_profile(po),
                          hw_profile_);
    std::cerr << "wrote " << hw_profile_ << "\n";
  }
  const auto report = bench::hw_report();
  if (!hw_out_.empty()) write_file_atomic(hw_out_, report.dump(2) + "\n");
  std::cout << (hw_json_ ? report.dump(2) + "\n" : bench::hw_report_text(report));
  return 0;
}

int BenchCommands::gemm() {
  if (!internal_spec_.empty()) return bench::run_raw_blas_child(internal_spec_);
  gemm_options_.sizes = parse_sizes(gemm_sizes_, "--sizes");
  gemm_options_.progress = true;
  gemm_options_.device = device::parse_device(gemm_device_, "--device");
  // The profile is checked before measuring, not after.
  std::optional<plan::HwProfile> profile;
  if (!gemm_profile_.empty()) profile = plan::load_hw_profile(gemm_profile_);
  const auto result = bench::run_gemm_bench(gemm_options_);
  if (profile) {
    bench::add_to_profile(result, *profile);
    plan::save_hw_profile(*profile, gemm_profile_);
  }
  gemm_out_.emit(result, "\n" + result.summary_text() + blas_line());
  return 0;
}

int BenchCommands::comm(Context& ctx) {
  if (comm_np_ > 0 && !under_mpirun()) relaunch_under_mpirun(ctx.argc, ctx.argv, comm_np_);
  bench::CommBenchOptions& c = comm_options_;
  c.min_bytes = parse_size(comm_min_, "-b/--minbytes");
  c.max_bytes = parse_size(comm_max_, "-e/--maxbytes");
  if (const size_t es = comm::size_of(comm::parse_dtype(c.dtype, "--dtype"));
      static_cast<size_t>(c.min_bytes) < es) {
    throw InputError("-b/--minbytes: expected at least one " + c.dtype + " element (" +
                     std::to_string(es) + " bytes), got " + comm_min_);
  }
  c.check = !no_check_;
  c.progress = true;  // live on a terminal, else a line every 10 s
  for (const auto& a : comm_add_sizes_) c.add_sizes.push_back(parse_size(a, "--add-sizes"));
  c.device = device::parse_device(comm_device_, "--device");
  if (c.device == device::DeviceKind::cuda) {
    // The NCCL sweep has one algorithm and NCCL's own buffers: the flags
    // about anvil's CPU algorithms are refused, not ignored.
    if (c.late_peer_ms > 0)
      throw InputError("--late-peer: expected --device cpu (it times anvil's CPU collectives)");
    if (!c.algos.empty())
      throw InputError("--algo: expected --device cpu (the GPU sweep times NCCL)");
    if (c.in_place)
      throw InputError("--inplace: expected --device cpu (NCCL's sweep is out of place)");
    if (c.registered) throw InputError("--registered: expected --device cpu");
    if (c.refine != 0) throw InputError("--refine: expected --device cpu");
    if (c.stall_rank >= 0) throw InputError("--stall-rank: expected --device cpu");
    return comm_gpu(ctx);
  }
  comm::MpiRuntime mpi(&ctx.argc, &ctx.argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
  try {
    // The profile is checked before minutes of measuring, not after.
    std::optional<plan::HwProfile> profile;
    if (!comm_profile_.empty()) profile = plan::load_hw_profile(comm_profile_);
    comm::Communicator world(MPI_COMM_WORLD, ranks_per_node_);
    const auto result = bench::run_comm_bench(world, c);
    if (ctx.rank == 0) emit_comm(result, profile);
  } catch (const comm::CommTimeout& e) {
    abort_on_timeout(e);
  }
  return 0;
}

// NCCL, one GPU per rank. One rank needs no MPI at all (a GPU machine without
// Open MPI); under mpirun the MPI runtime hands NCCL's id around.
int BenchCommands::comm_gpu(Context& ctx) {
  device::require(device::DeviceKind::cuda, "--device");
  std::optional<plan::HwProfile> profile;
  if (!comm_profile_.empty()) profile = plan::load_hw_profile(comm_profile_);
  bench::GpuCommRuntime rt;
  std::optional<comm::MpiRuntime> mpi;
  if (under_mpirun()) {
    mpi.emplace(&ctx.argc, &ctx.argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rt.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &rt.world);
    ctx.rank = rt.rank;
    rt.broadcast_id = [](void* bytes, size_t n) {
      MPI_Bcast(bytes, static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD);
    };
    rt.max_over_ranks = [](double t) {
      double slowest = t;
      MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return slowest;
    };
  }
  const auto result = bench::run_comm_bench_gpu(comm_options_, rt);
  if (ctx.rank == 0) emit_comm(result, profile);
  return 0;
}

void BenchCommands::emit_comm(const bench::CommBenchResult& result,
                              std::optional<plan::HwProfile>& profile) {
  if (profile) {
    bench::add_to_profile(result, *profile);
    plan::save_hw_profile(*profile, comm_profile_);
  }
  if (!tuning_out_.empty()) bench::tuning_from(result).save(tuning_out_);
  const auto j = result.to_json();
  if (!comm_out_.out.empty()) write_file_atomic(comm_out_.out, j.dump(2) + "\n");
  std::cout << (comm_out_.json ? j.dump(2) + "\n" : comm_out_.csv ? result.csv() : result.text());
}

}  // namespace

std::unique_ptr<CommandFamily> make_bench_commands() {
  return std::make_unique<BenchCommands>();
}

}  // namespace anvil::cli
