#include "anvil/train/trainer.hpp"
#include "anvil/kernels/layers.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <span>

#include "anvil/base/checksum.hpp"
#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/step_parts.hpp"
#include "anvil/base/table.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/device_decoder.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/gemm_shapes.hpp"
#include "anvil/optim/device_muon.hpp"
#include "anvil/parallel/context_group.hpp"
#include "anvil/parallel/data_parallel.hpp"
#include "anvil/parallel/expert_parallel.hpp"

namespace anvil::train {
namespace {

// `work` on every rank; an InputError on some ranks becomes the same error on
// every rank (the lowest such rank's text, named), so that the others do not
// train on into a collective the failed ones never reach.
void agree_on_input_errors(parallel::DataParallelGroup* dp, const std::function<void()>& work) {
  std::string error;
  try {
    work();
  } catch (const InputError& e) {
    if (dp == nullptr) throw;
    error = e.what();
  }
  if (dp == nullptr) return;
  const std::vector<double> failed = dp->gather(error.empty() ? 0.0 : 1.0);
  const auto first = std::find(failed.begin(), failed.end(), 1.0);
  if (first == failed.end()) return;
  const int root = static_cast<int>(first - failed.begin());
  int64_t length = static_cast<int64_t>(error.size());
  dp->comm().broadcast(&length, 1, comm::DType::i64, root, comm::Algo::automatic);
  std::vector<int32_t> words(static_cast<size_t>((length + 3) / 4), 0);
  if (dp->rank() == root) std::memcpy(words.data(), error.data(), error.size());
  dp->comm().broadcast(words.data(), words.size(), comm::DType::i32, root, comm::Algo::automatic);
  const std::string text(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
  throw InputError(root == 0 ? text : "rank " + std::to_string(root) + ": " + text);
}

// A buffer outside the registry as one whole replicated tensor.
model::TensorShard whole_shard(const model::ExtraTensor& e) {
  int64_t n = 1;
  for (const int64_t d : e.shape) n *= d;
  return {e.name, e.shape, 0, n, 0, model::Sharding::replicated, e.data};
}

std::atomic<int> g_stop{0};  // the stop signal's number, 0: none
extern "C" void on_stop_signal(int sig) {
  g_stop.store(sig);
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

// The median, leaving out the first (warm-up) when there are more.
double median_after_first(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// This job's nonce for checkpoint temporaries: rank 0's clock, the same on every rank.
std::string job_nonce(int rank, parallel::DataParallelGroup* dp) {
  int64_t nonce = rank == 0 ? static_cast<int64_t>(now_seconds() * 1e6) % 1000000000000 : 0;
  if (dp && dp->size() > 1) dp->sum(std::span<int64_t>(&nonce, 1));
  return std::to_string(nonce);
}

// --device cuda's refusals, before any work: what the GPU path does not
// build, then whether this binary and machine can run it at all.
void check_device(const TrainOptions& o, const model::ModelConfig& config) {
  if (o.model.device == "cpu") {
    if (o.model.tf32) throw InputError("model.tf32: expected --device cuda (TF32 is a GPU mode)");
    return;
  }
  const model::ModelFamily& family = model::model_family(config);
  if (family.has_experts())
    throw InputError("model.device: cuda trains the dense family (gpt2, llama configs); " +
                     family.name() + " (" + config.name + ") has no GPU path yet");
  if (!o.metrics.hw_profile.empty())
    throw InputError(
        "metrics.hw_profile: with --device cuda the MFU peak is measured on the GPU "
        "or given (expected --peak-gflops, or no peak option)");
  if (o.parallel.cp > 1)
    throw InputError(
        "parallel.cp: context parallelism with --device cuda is not built yet "
        "(expected 1)");
  if (!device::cuda_built())
    throw InputError(
        "model.device: cuda: this anvil was built without CUDA (ANVIL_CUDA=off, or "
        "no nvcc at build time)");
  const std::string why = device::cuda_unavailable_reason();
  if (!why.empty()) throw InputError("model.device: cuda: no CUDA device can be used: " + why);
}

TrainOptions finished(TrainOptions o) {
  o.finish();
  if (o.model.config.empty())
    throw InputError("model.config: expected a model config file (configs/*.json)");
  return o;
}

}  // namespace

Trainer::Trainer(const TrainOptions& options, parallel::DataParallelGroup* dp)
    : o_(finished(options)),
      dp_(dp),
      rank_(dp ? dp->rank() : 0),
      world_(dp ? dp->size() : 1),
      cp_(o_.parallel.cp),
      dp_rank_(rank_ / cp_),
      dp_size_(std::max(1, world_ / cp_)),
      config_([this] {  // the device refused before the data is read
        model::ModelConfig c = model::load_model_config(o_.model.config, o_.model.set);
        check_device(o_, c);
        return c;
      }()),
      B_(o_.train.batch),
      T_(o_.train.seq == 0 ? config_.seq_len : o_.train.seq),
      T_local_(T_ / cp_),
      precision_(o_.model.dtype == "bf16" ? model::Precision::bf16 : model::Precision::fp32),
      batches_(data::parse_sources(o_.train.data, "train.data"), config_.vocab_size, o_.train.seed,
               T_, o_.train.val_fraction),
      injector_(o_.faults, rank_),
      guard_(o_.guard, rank_, !o_.metrics.quiet && rank_ == 0),
      stragglers_(o_.guard.straggler_factor, o_.guard.straggler_steps) {
  if (T_ < 1 || T_ > config_.seq_len) {
    throw InputError("train.seq: expected 1.." + std::to_string(config_.seq_len) +
                     " (the config's seq_len), got " + std::to_string(T_));
  }
  if (cp_ > 1) {
    if (dp_ == nullptr || world_ % cp_ != 0)
      throw InputError("parallel.cp: expected a run under mpirun with a multiple of " +
                       std::to_string(cp_) + " ranks, got " + std::to_string(world_));
    if (T_ % (2 * cp_) != 0 || T_ / (2 * cp_) < 2)
      throw InputError("train.seq: context parallelism over " + std::to_string(cp_) +
                       " ranks cuts each sequence into " + std::to_string(2 * cp_) +
                       " chunks of at least 2 tokens: expected a multiple of " +
                       std::to_string(2 * cp_) + " >= " + std::to_string(4 * cp_) + ", got " +
                       std::to_string(T_));
  }
  const bool report = !o_.metrics.quiet && rank_ == 0;
  checkpoints_ = std::make_unique<CheckpointManager>(o_.checkpoint, rank_, world_,
                                                     job_nonce(rank_, dp_), injector_, report);
  // Whether and where it resumes is settled before anything is printed or built.
  const std::optional<ResumePoint> from = checkpoints_->resume_point(record());
  // At the last step a resume trains nothing (a supervisor's restart after
  // the final save ends there); past it, --steps is too small.
  if (from && !from->weights_only && from->step > o_.train.steps) {
    throw InputError("train.steps: " + from->dir + " is at step " + std::to_string(from->step) +
                     "; expected --steps >= " + std::to_string(from->step) + ", got " +
                     std::to_string(o_.train.steps));
  }
  if (cp_ > 1)
    context_ = std::make_unique<parallel::MpiContextGroup>(dp_->context_group(cp_));
  build_model();
  optimizer_ =
      std::make_unique<parallel::DistributedOptimizer>(*model_, o_.optimizer, o_.parallel, dp_);
  tokens_.resize(static_cast<size_t>(B_ * T_local_));
  targets_.resize(static_cast<size_t>(B_ * T_local_));
  if (cp_ > 1) {
    full_tokens_.resize(static_cast<size_t>(B_ * T_));
    full_targets_.resize(static_cast<size_t>(B_ * T_));
  }
  // Every rank reads a given peak or profile (a bad profile fails everywhere
  // alike); only rank 0, which reports MFU, measures one.
  if (o_.model.device == "cuda") {
    if (rank_ == 0 || o_.metrics.peak_gflops > 0)
      peak_ = device_gemm_peak(o_.metrics.peak_gflops, device::DeviceKind::cuda,
                               precision_ == model::Precision::bf16 ? Dtype::bf16
                               : o_.model.tf32                      ? Dtype::tf32
                                                                    : Dtype::fp32);
  } else if (rank_ == 0 || o_.metrics.peak_gflops > 0 || !o_.metrics.hw_profile.empty()) {
    peak_ = gemm_peak(o_.metrics.peak_gflops, o_.metrics.hw_profile, precision_);
  }
  result_.world = world_;
  result_.peak_gflops = peak_.gflops;
  result_.peak_source = peak_.source;
  result_.flops_per_token = model::training_flops_per_token(config_, T_);
  result_.optimizer_bytes = optimizer_->state_bytes();
  result_.optimizer_on_device = optimizer_->on_device();
  result_.parameter_bytes = model_->plan().parameters;
  const auto& plan = model_->plan();
  result_.planned_bytes = plan.parameters + plan.gradients + result_.optimizer_bytes +
                          plan.activations + plan.low_precision;
  const double limit = o_.train.memory_limit_gib * 1024.0 * 1024.0 * 1024.0;
  if (limit > 0 && static_cast<double>(result_.planned_bytes) > limit) {
    throw InputError("train.memory_limit_gib: the memory plan needs " +
                     human_bytes(result_.planned_bytes) + " per rank (activations " +
                     human_bytes(plan.activations) + "), more than the limit of " +
                     fmt(o_.train.memory_limit_gib, 2) +
                     " GiB (expected a plan within it: a shorter train.seq or train.batch, or "
                     "parallel.cp under mpirun)");
  }
  if (report) print_plan();
  start(from);
}

Trainer::~Trainer() = default;

std::string device_memory_shortfall(size_t planned_bytes, int64_t free_bytes, int gpu) {
  if (static_cast<int64_t>(planned_bytes) <= free_bytes) return "";
  return "model.device: cuda: the memory plan needs " + human_bytes(planned_bytes) + " on GPU " +
         std::to_string(gpu) + ", which has " + human_bytes(static_cast<double>(free_bytes)) +
         " free (expected a plan within it: a smaller train.batch or train.seq, or the batch "
         "split over more GPUs under mpirun)";
}

void Trainer::check_device_memory() {
  const model::MemoryPlan plan = model::DeviceDecoder::plan_for(
      config_, B_, T_local_, /*training=*/true, precision_,
      model::DeviceDecoder::fuses_attention(device::DeviceKind::cuda, precision_));
  const size_t params = plan.parameters;
  // The optimizer steps on the device (parallel/distributed_optimizer.hpp):
  // AdamW's two moments (of this rank's block under ZeRO-1; with Muon, of
  // the rest: two per parameter bounds both), with accumulation the earlier
  // micro-batches' sum, and Muon's momentum and Newton-Schulz scratch with
  // its own GEMM engine's workspace.
  const bool device_step =
      parallel::DistributedOptimizer::steps_on_device(o_.optimizer, o_.parallel);
  const size_t moments =
      2 * (o_.parallel.zero ? params / static_cast<size_t>(dp_size_) + sizeof(float) : params);
  size_t planned = plan.parameters + plan.gradients + plan.activations + plan.low_precision +
                   (32u << 20);  // cuBLASLt's workspace
  if (device_step) planned += moments + (o_.train.accum > 1 ? params : 0);
  if (device_step && o_.optimizer.name == "muon")
    planned += optim::DeviceMuon::planned_bytes(model::decoder_registry(config_), o_.optimizer.muon,
                                                dp_rank_, dp_size_) +
               (32u << 20);
  result_.device_planned_bytes = planned;
  device_free_at_start_ = device::gpu_memory().free_bytes;
  const std::string why =
      device_memory_shortfall(planned, device_free_at_start_, device::gpu_for_rank(rank_));
  if (!why.empty()) throw InputError(why);
}

void Trainer::build_model() {
  const int ep = o_.parallel.ep;
  const model::ModelFamily& family = model::model_family(config_);
  model::ModelOptions build{B_, T_, /*training=*/true, precision_, o_.balancing, {}, {}};
  build.context = context_.get();
  build.device = device::parse_device(o_.model.device, "model.device");
  build.tf32 = o_.model.tf32;
  if (build.device == device::DeviceKind::cuda) {
    device::select_gpu(device::gpu_for_rank(rank_));
    check_device_memory();
  }
  if (ep > 1) {
    if (!family.has_experts())
      throw InputError("parallel.ep: expert parallelism needs a model with experts (" +
                       family.name() + " has none)");
    // Under expert parallelism each rank holds the weights of its E/ep
    // experts only; the others' tokens go to them by all-to-all.
    if (!dp_)
      throw InputError("parallel.ep: expected a run under mpirun with a multiple of ep ranks");
    if (config_.n_experts % ep != 0) {
      throw InputError("parallel.ep: " + std::to_string(ep) + " does not divide the " +
                       std::to_string(config_.n_experts) +
                       " experts (expected a divisor of n_experts)");
    }
    comm::Communicator& group = dp_->expert_group(ep);  // checks that ep divides the ranks
    build.experts.count = config_.n_experts / ep;
    build.experts.first = rank_ % ep * build.experts.count;
    auto scratch = std::make_shared<std::shared_ptr<parallel::AllToAllDispatcher::Scratch>>();
    build.dispatcher = [&group, scratch](const model::ZayaMoeShape& shape, int64_t tokens) {
      // The first layer's exchange buffers serve every layer.
      auto d = std::make_unique<parallel::AllToAllDispatcher>(group, shape, tokens, *scratch);
      *scratch = d->scratch();
      return std::unique_ptr<model::TokenDispatcher>(std::move(d));
    };
  }
  model_ = family.make_model(config_, build);
}

RunRecord Trainer::record() const {
  RunRecord r;
  r.config = nlohmann::json::parse(model::model_config_to_json(config_));
  r.seed = o_.train.seed;
  r.batch = B_;
  r.world = dp_size_;  // the replicas whose rows make the global batch
  r.seq = T_;
  r.accum = o_.train.accum;
  r.precision = o_.model.dtype;
  r.device = o_.model.device;
  r.optimizer = o_.optimizer.name;
  r.data = o_.train.data;
  r.tokenizer = batches_.tokenizer();
  r.tokenizer_model = batches_.tokenizer_model();
  r.phase = o_.phase.name;
  r.phase_first = o_.phase.first_step + 1;
  r.phase_last = o_.train.steps;
  r.schedule = o_.optimizer.schedule;
  r.layout = {{"world", world_},      {"zero", o_.parallel.zero},
              {"ep", o_.parallel.ep}, {"cp", cp_},
              {"optimizer", o_.optimizer.name}, {"batch", B_},
              {"accum", o_.train.accum}};
  return r;
}

void Trainer::print_plan() const {
  const auto& plan = model_->plan();
  std::printf("model %s: %s parameters (%lld tensors), batch %lldx%lld, accum %lld",
              config_.name.c_str(), fmt(static_cast<double>(model_->registry().total()), 0).c_str(),
              static_cast<long long>(model_->registry().specs().size()), static_cast<long long>(B_),
              static_cast<long long>(T_), static_cast<long long>(o_.train.accum));
  if (world_ > 1 && optimizer_->on_device()) {
    std::printf(
        ", %d data-parallel ranks (global batch %lld rows; gradients summed on the "
        "devices %s)",
        dp_size_, static_cast<long long>(B_ * o_.train.accum * dp_size_),
        o_.parallel.zero
            ? "per layer while backward runs, each rank's block by its reduce, updated there and "
              "broadcast back (ZeRO-1)"
            : "by one all-reduce per layer while backward runs");
  } else if (world_ > 1) {
    std::printf(
        ", %d data-parallel ranks (global batch %lld rows; %d threads each; %lld gradient "
        "buckets)",
        dp_size_, static_cast<long long>(B_ * o_.train.accum * dp_size_), num_threads(),
        static_cast<long long>(optimizer_->bucket_count()));
  }
  if (cp_ > 1) {
    std::printf(", context parallel over %d ranks each (every sequence in %d chunks of %lld "
                "tokens; %lld tokens per row here)",
                cp_, 2 * cp_, static_cast<long long>(T_ / (2 * cp_)),
                static_cast<long long>(T_local_));
  }
  if (o_.model.device == "cuda")
    std::printf(", on cuda (GPU %d: %s%s)", device::gpu_for_rank(rank_),
                device::gpu_properties(device::gpu_for_rank(rank_)).name.c_str(),
                o_.model.tf32 ? ", TF32 matmuls" : "");
  std::printf(
      "\nmemory plan%s%s: parameters %s | gradients %s | optimizer %s | activations %s%s | "
      "total %s\n",
      world_ > 1 ? " per rank" : "",
      o_.model.device != "cuda" ? ""
      : optimizer_->on_device() ? " (all of it on the GPU; the optimizer steps there)"
                                : " (parameters, gradients, activations on the GPU; the "
                                  "optimizer on host copies)",
      human_bytes(plan.parameters).c_str(), human_bytes(plan.gradients).c_str(),
      human_bytes(result_.optimizer_bytes).c_str(), human_bytes(plan.activations).c_str(),
      plan.low_precision > 0
          ? (" | bf16 weights+scratch " + human_bytes(plan.low_precision)).c_str()
          : "",
      human_bytes(result_.planned_bytes).c_str());
  std::printf("data: %s (%s); %.3f GFLOP/token; MFU against a %s GEMM peak of %.1f GFLOP/s (%s)\n",
              o_.train.data.empty() ? "random tokens" : o_.train.data.c_str(),
              batches_.tokenizer().c_str(), result_.flops_per_token / 1e9, o_.model.dtype.c_str(),
              peak_.gflops, peak_.source.c_str());
  if (precision_ == model::Precision::bf16 ||
      (o_.optimizer.name == "muon" && o_.optimizer.muon.ns_bf16))
    std::printf("bf16 GEMM: %s\n", device::bf16_path_description(device::bf16_path()).c_str());
  if (precision_ == model::Precision::bf16 && o_.model.device != "cuda") {
    const kernels::AttentionTiles tiles = kernels::attention_tiles_for(true, config_.head_dim);
    std::printf("attention: %s\n", kernels::attention_tiles_description(tiles).c_str());
  } else if (o_.model.device == "cuda") {
    std::printf("attention: %s\n",
                model::DeviceDecoder::fuses_attention(device::DeviceKind::cuda, precision_)
                    ? "cuDNN fused (bf16; a shape cuDNN has no plan for runs unfused, with a "
                      "warning)"
                    : "unfused (GEMMs and a softmax kernel)");
  }
  std::fflush(stdout);
}

// Initialises or resumes the weights and state, then opens the run's outputs.
void Trainer::start(const std::optional<ResumePoint>& from) {
  const bool report = !o_.metrics.quiet && rank_ == 0;
  if (!from) {
    model_->registry().initialize(model_->params(), o_.train.seed);
  } else {
    // Every rank reads all the weights and the optimizer state it keeps,
    // from whatever layout wrote them.
    std::vector<model::TensorShard> want =
        model_->registry().shards(model_->params(), {{0, model_->registry().total()}});
    for (const auto& e : model_->extra_state())
      if (!from->weights_only || !e.optimizer_state) want.push_back(whole_shard(e));
    if (!from->weights_only)
      for (auto& piece : optimizer_->state_to_load()) want.push_back(piece);
    agree_on_input_errors(dp_, [&] { ckpt::load_pieces(from->dir, want); });
    if (rank_ == 0)
      for (const std::string& w : from->warnings)
        std::fprintf(stderr, "anvil: warning: %s\n", w.c_str());
    step_ = from->step;
    // A new phase of a recipe starts the spike guard afresh: its mixture,
    // sequence or RoPE base may move the loss for good, and the previous
    // phase's losses would read that as a spike (a run entering the phase
    // in the same process and one resuming into it start alike).
    if (!from->weights_only && !o_.checkpoint.resume_new_phase) guard_.restore(from->state);
    if (report && from->weights_only)
      std::printf("starting from the weights of %s (fresh optimizer state, step 0)\n",
                  from->dir.c_str());
    else if (report)
      std::printf("resumed from %s at step %lld\n", from->dir.c_str(),
                  static_cast<long long>(step_));
  }
  result_.first_step = step_;
  guard_.heartbeat(step_,
                   std::numeric_limits<double>::quiet_NaN());  // alive, before the first step
  const std::string& out = o_.checkpoint.out;
  if (!out.empty() && rank_ == 0) {
    std::filesystem::create_directories(out);
    ft::Injector::clear_stale_fill(out);
    // The run decodes with the tokenizer it trained on (anvil generate, eval).
    if (!batches_.tokenizer_model().empty())
      write_file_atomic(out + "/" + ckpt::kTokenizerFile, read_file(batches_.tokenizer_model()));
    write_file_atomic(out + "/train.json", repeatable(o_).to_json().dump(2) + "\n");
  }
  // mpirun gives rank 0 a pseudo-terminal even when its own output is a file.
  const bool tty = ::isatty(STDOUT_FILENO) != 0 && dp_ == nullptr;
  metrics_ = std::make_unique<MetricsLogger>(o_.metrics, o_.phase, out, rank_, world_,
                                             o_.parallel.ep, tty);
  metrics_->open(step_, o_.train.steps);
}

std::array<double, 2> Trainer::forward_backward_step() {
  std::array<double, 2> sums = {0, 0};  // summed token losses and scored tokens
  const int64_t accum = o_.train.accum;
  const auto grad_scale =
      static_cast<float>(1.0 / static_cast<double>(B_ * T_ * accum * dp_size_));
  for (int64_t m = 0; m < accum; ++m) {
    if (cp_ > 1) {
      batches_.train_micro_batch(step_, m, dp_rank_, dp_size_, B_, full_tokens_.data(),
                                 full_targets_.data());
      take_local_chunks();
    } else {
      batches_.train_micro_batch(step_, m, rank_, world_, B_, tokens_.data(), targets_.data());
    }
    // The last micro-batch's backward hands finished gradients to the
    // reduction. Each micro-batch's gradients are computed alone and added to
    // the earlier ones' sum (not accumulated into them by backward): two
    // ranks' reduction adds one micro-batch's to another's the same way, so
    // one rank with two micro-batches trains the two-rank run's bits.
    const bool last = m + 1 == accum;
    if (m > 0) model_->zero_grads();
    if (last) optimizer_->start_reduction(/*with_earlier=*/m > 0);
    int64_t scored = 0;
    sums[0] += model_->forward_backward(tokens_.data(), targets_.data(), B_, T_local_, grad_scale,
                                        &scored);
    sums[1] += static_cast<double>(scored);
    if (last)
      optimizer_->stop_handing_over();
    else
      optimizer_->keep_earlier(/*first=*/m == 0);
  }
  sums[0] = injector_.step_loss(step_, sums[0]);
  return sums;
}

void Trainer::take_local_chunks() {
  const model::ContextLayout layout{cp_, rank_ % cp_, T_};
  layout.take_local(full_tokens_.data(), tokens_.data(), B_, 1);
  layout.take_local(full_targets_.data(), targets_.data(), B_, 1);
}

double Trainer::tokens_per_step() const {
  return static_cast<double>(B_ * T_ * o_.train.accum * dp_size_);
}

StepStats Trainer::step() {
  const double t0 = now_seconds();
  injector_.step_begin(step_, last_step_seconds_);
  StepStats s;
  s.step = step_ + 1;
  start_step_parts();
  model_->zero_grads();
  std::array<double, 2> sums = forward_backward_step();
  s.parts = take_step_parts();
  s.forward_backward_seconds = now_seconds() - t0;
  s.alltoall_seconds = model_->take_dispatch_seconds();
  const model::TrainableModel::ContextSeconds context = model_->take_context_seconds();
  s.context_seconds = context.kv + context.halo;
  s.context_halo_seconds = context.halo;
  const parallel::ReduceTimes t = optimizer_->finish_reduction();
  s.comm_seconds = t.comm_seconds;
  s.exposed_seconds = t.exposed_seconds;
  if (dp_ && world_ > 1) {  // the loss over the global batch; the model's counters too
    dp_->sum(sums);
    dp_->sum(model_->step_counts());
  }
  s.loss = sums[0] / sums[1];
  const double norm0 = now_seconds();
  s.grad_norm = optimizer_->grad_norm();
  s.optimizer_seconds = now_seconds() - norm0;
  s.lr = o_.optimizer.schedule.at(step_);
  // The loss and norm are global: every rank decides the same here.
  guard_.check_finite(s.step, s.loss, s.grad_norm);
  s.skipped = guard_.is_spike(s.step, s.loss);
  if (s.skipped) {  // nothing of the step stays: its counters (expert loads) go too
    const std::span<int64_t> counts = model_->step_counts();
    std::fill(counts.begin(), counts.end(), 0);
  }
  // A background save still reading the weights and moments finishes first.
  s.save_wait_seconds = checkpoints_->wait();
  if (!s.skipped) {
    const double update0 = now_seconds();
    optimizer_->update(static_cast<float>(s.lr),
                       optim::clip_coefficient(s.grad_norm, o_.optimizer.clip), step_ + 1);
    model_->after_step(step_ + 1);
    s.optimizer_seconds += now_seconds() - update0;
  }
  ++step_;
  injector_.step_updated(step_, [&] { return model_->params(); });
  s.seconds = now_seconds() - t0;
  guard_.heartbeat(step_, s.loss);
  last_step_seconds_ = s.seconds - s.exposed_seconds - s.alltoall_seconds - s.context_seconds;
  injector_.step_end(step_);
  return s;
}

double Trainer::validate() {
  if (!batches_.has_validation()) return -1.0;
  // Whole micro-batches on every rank (val_batches rounded up to a multiple
  // of batch x ranks), each rank its share: the same rows on any rank count
  // with the same batch x ranks.
  // Under context parallelism the replicas take rows, and the ranks of a
  // context group their chunks of them.
  const int64_t rows = B_ * dp_size_;
  const int64_t val_rows = (o_.train.val_batches + rows - 1) / rows * rows;
  double sums[2] = {0, 0};
  for (int64_t i = 0; i < val_rows; i += rows) {
    int32_t* tokens = cp_ > 1 ? full_tokens_.data() : tokens_.data();
    int32_t* targets = cp_ > 1 ? full_targets_.data() : targets_.data();
    for (int64_t r = 0; r < B_; ++r)
      batches_.val_row(i + dp_rank_ * B_ + r, val_rows, &tokens[r * T_], &targets[r * T_]);
    if (cp_ > 1) take_local_chunks();
    int64_t scored = 0;
    sums[0] += model_->forward(tokens_.data(), targets_.data(), B_, T_local_, &scored);
    sums[1] += static_cast<double>(scored);
  }
  if (dp_ && world_ > 1) dp_->sum(sums);
  return sums[0] / sums[1];
}

void Trainer::save() {
  if (!checkpoints_->enabled()) return;
  checkpoints_->wait();  // the previous write may still read what this one hands over
  // Each rank writes its share: the weights and replicated state in its
  // reducer blocks, the optimizer state it owns (ZeRO-1 ranges, its Muon
  // matrices); rank 0 the extras.
  float* weights = model_->params_for_reading();
  if (world_ > 1) check_replicas(weights);
  ckpt::ShardedSave save;
  save.model = model_->registry().shards(weights, optimizer_->owned());
  save.optimizer = optimizer_->state_to_save();
  if (rank_ == 0)
    for (const auto& e : model_->extra_state())
      (e.optimizer_state ? save.optimizer : save.model).push_back(whole_shard(e));
  checkpoints_->save(step_, std::move(save), record(), guard_.state());
  saved_step_ = step_;
  if (rank_ == 0) result_.last_checkpoint = checkpoints_->last();
}

// Every rank holds the same weights: each replica's update reads the same
// reduced gradients, and ZeRO-1 gathers every block from its owner. A rank
// whose weights differ carries silent corruption (a bit flipped in memory,
// a faulty core), which its checkpoint share would mix into the others'. So
// each save first compares a CRC-32 of the weights every rank holds (under
// expert parallelism all but the experts') across the ranks; a difference
// ends the run with kExitDiverged and the checkpoint unwritten, for a
// supervisor to roll back to the last one, which passed this check.
void Trainer::check_replicas(const float* weights) const {
  const bool every_expert = o_.parallel.ep <= 1;
  uint32_t crc = 0;
  for (const model::ParamSpec& s : model_->registry().specs())
    if (every_expert || s.sharding != model::Sharding::expert)
      crc = crc32(weights + s.offset, static_cast<size_t>(s.numel) * sizeof(float), crc);
  const std::vector<double> all = dp_->gather(static_cast<double>(crc));
  std::string differ;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (differ.empty()) return;
  throw ft::TrainingFault("step " + std::to_string(step_) + ": the weights of rank(s) " + differ +
                              " differ from rank 0's (the data-parallel replicas diverged: silent "
                              "corruption); checkpoint not written, roll back to the last one",
                          ft::kExitDiverged);
}

double Trainer::mfu(double tokens_per_second) const {
  if (!(result_.peak_gflops > 0)) return 0;  // ranks other than 0 do not measure the peak
  return tokens_per_second * result_.flops_per_token / (result_.peak_gflops * 1e9 * world_);
}

bool Trainer::stop_requested() {
  // Every rank stops at the same step, whichever got the signal.
  // Rank 0 alone names a straggler to exclude (rank + 1 in the second slot).
  if (!dp_ || world_ == 1) return g_stop.load() != 0;
  int64_t flags[2] = {g_stop.load() != 0 ? 1 : 0, straggler_ >= 0 ? straggler_ + 1 : 0};
  dp_->sum(std::span<int64_t>(flags, 2));
  if (flags[1] > 0) straggler_ = static_cast<int>(flags[1] - 1);
  return flags[0] > 0 || flags[1] > 0;
}

void Trainer::log(const StepStats& s, double val, double iteration_start) {
  StepReport r;
  r.val_loss = val;
  r.tokens_per_step = tokens_per_step();
  r.mfu = mfu(r.tokens_per_step / s.seconds);
  // Every rank's own peak memory and communication, for rank 0's metrics.
  if (dp_ && metrics_->wants_rank_numbers()) {
    r.rank_rss = dp_->gather(static_cast<double>(peak_rss_bytes()));
    r.rank_comm = dp_->gather(s.comm_seconds);
    r.rank_exposed = dp_->gather(s.exposed_seconds);
  }
  // Each rank's compute (its step less its waits in collectives) and waits:
  // a straggler computes longer while the others wait for it.
  if (dp_ && world_ > 1 && (metrics_->wants_rank_numbers() || o_.guard.straggler_factor > 0)) {
    const double wait = s.exposed_seconds + s.alltoall_seconds + s.context_seconds;
    r.rank_compute = dp_->gather(std::max(0.0, s.seconds - wait));
    r.rank_wait = dp_->gather(wait);
  }
  if (rank_ != 0) return;
  if (const auto slow = stragglers_.feed(s.step, r.rank_compute)) {
    const bool exclude = o_.guard.straggler_action == "exclude";
    std::fprintf(stderr,
                 "anvil: warning: rank %d is a straggler: compute %.1f ms per step, %.1fx the "
                 "other ranks' median %.1f ms, for %d steps since step %lld%s\n",
                 slow->rank, 1e3 * slow->compute_s, slow->compute_s / slow->others_median_s,
                 1e3 * slow->others_median_s, o_.guard.straggler_steps,
                 static_cast<long long>(slow->since_step),
                 exclude ? "; checkpointing and stopping to restart without it" : "");
    if (exclude && straggler_ < 0) straggler_ = slow->rank;
  }
  r.model_metrics = model_->step_metrics();
  if (!o_.metrics.quiet) r.model_note = model_->progress_note();
  r.iteration_seconds = now_seconds() - iteration_start;
  metrics_->log(s, r);
}

StopSignals::StopSignals()
    : int_(std::signal(SIGINT, on_stop_signal)), term_(std::signal(SIGTERM, on_stop_signal)) {
  if (int_ != on_stop_signal) g_stop.store(0);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, int_);
  std::signal(SIGTERM, term_);
}

int pending_stop_signal() {
  return g_stop.load();
}

TrainResult Trainer::run() {
  std::vector<StepStats> steps;
  // In scope through the final save: a second signal (a scheduler's, then
  // mpirun's) must not kill the process while it writes the checkpoint.
  const StopSignals signals;
  {
    // An iteration: the stop vote, the step, validation and the metrics line
    // (its gathers); the checkpoint save is not part of it.
    double iteration_start = now_seconds();
    bool stopped = false;
    while (step_ < o_.train.steps && !(stopped = stop_requested())) {
      steps.push_back(step());
      const bool last = step_ == o_.train.steps;
      const bool val_now = (o_.train.val_every > 0 && step_ % o_.train.val_every == 0) || last;
      const double val = val_now ? validate() : -1;
      if (last) result_.val_loss = val;
      log(steps.back(), val, iteration_start);
      if (o_.checkpoint.every > 0 && step_ % o_.checkpoint.every == 0 && !last) save();
      iteration_start = now_seconds();
    }
    // A signal on any rank (the vote) ends every rank early; the status
    // says so (128 + the signal, SIGTERM where another rank had it).
    if (stopped && straggler_ < 0)
      result_.stop_signal = g_stop.load() != 0 ? g_stop.load() : SIGTERM;
  }
  // Not twice: a stop right after an interval's save has its checkpoint.
  if (step_ > result_.first_step && step_ != saved_step_) save();
  checkpoints_->wait(/*final=*/true);
  finish_result(steps);
  if (straggler_ >= 0 && step_ < o_.train.steps) {
    // For anvil launch: which rank to leave out ("RANK"), then status 12.
    if (rank_ == 0 && !o_.guard.heartbeat.empty())
      write_file_atomic(o_.guard.heartbeat + "/straggler", std::to_string(straggler_) + "\n");
    throw ft::TrainingFault("rank " + std::to_string(straggler_) + " is a straggler; stopped at step " +
                                std::to_string(step_) + " (checkpoint written) to restart without it",
                            ft::kExitStraggler);
  }
  return result_;
}

void Trainer::finish_result(const std::vector<StepStats>& steps) {
  std::vector<double> comm, exposed, alltoall, context, halo;
  std::map<std::string, std::vector<double>> parts;
  for (const StepStats& s : steps) {
    if (s.forward_backward_seconds > 0) {
      const nlohmann::json j = step_parts_json(s);
      for (const auto& [name, seconds] : j.items()) parts[name].push_back(seconds.get<double>());
    }
    result_.losses.push_back(s.loss);
    result_.step_seconds.push_back(s.seconds);
    comm.push_back(s.comm_seconds);
    exposed.push_back(s.exposed_seconds);
    alltoall.push_back(s.alltoall_seconds);
    context.push_back(s.context_seconds);
    halo.push_back(s.context_halo_seconds);
  }
  const double median = median_after_first(result_.step_seconds);
  if (median > 0) {
    result_.tokens_per_second = tokens_per_step() / median;
    result_.mfu = mfu(result_.tokens_per_second);
  }
  result_.comm_seconds = median_after_first(comm);
  result_.exposed_seconds = median_after_first(exposed);
  result_.alltoall_seconds = median_after_first(alltoall);
  result_.context_seconds = median_after_first(context);
  result_.context_halo_seconds = median_after_first(halo);
  for (const auto& [name, seconds] : parts)
    result_.part_seconds[name] = median_after_first(seconds);
  result_.cp = cp_;
  if (peak_.cached && result_.mfu > 1.05) {
    // The cached rate was measured in a busy moment: the next run measures again.
    forget_cached_peak(precision_);
    if (!o_.metrics.quiet)
      std::fprintf(stderr,
                   "anvil: warning: MFU %.0f%% is above the cached GEMM peak (%.1f GFLOP/s); "
                   "the cache entry is dropped and the next run measures again\n",
                   100 * result_.mfu, result_.peak_gflops);
  }
  result_.peak_rss_bytes = peak_rss_bytes();
  if (o_.model.device == "cuda") {
    const device::GpuMemory m = device::gpu_memory();
    result_.device_used_bytes =
        static_cast<size_t>(std::max<int64_t>(0, device_free_at_start_ - m.free_bytes));
    result_.device_total_bytes = static_cast<size_t>(m.total_bytes);
  }
  if (dp_ && world_ > 1)
    result_.rank_peak_rss_bytes = dp_->gather(static_cast<double>(result_.peak_rss_bytes));
  if (!o_.metrics.quiet && rank_ == 0) print_summary(result_.stop_signal != 0);
}

void Trainer::print_summary(bool stopped) const {
  const TrainResult& r = result_;
  if (stopped)
    std::printf("\nstopped by a signal at step %lld%s\n", static_cast<long long>(step_),
                o_.checkpoint.out.empty() ? "" : "; checkpoint written");
  std::printf(
      "done: %lld steps, median %.0f tok/s, MFU %.1f%% of %.1f GFLOP/s, peak RSS %s%s "
      "(plan %s)\n",
      static_cast<long long>(step_ - r.first_step), r.tokens_per_second, 100 * r.mfu, r.peak_gflops,
      human_bytes(r.peak_rss_bytes).c_str(), world_ > 1 ? " on rank 0" : "",
      human_bytes(r.planned_bytes).c_str());
  if (r.device_total_bytes > 0)
    std::printf(
        "GPU memory taken by the run: %s of %s (arenas, workspaces, NCCL; not CUDA's "
        "context; the device plan %s)\n",
        human_bytes(static_cast<double>(r.device_used_bytes)).c_str(),
        human_bytes(static_cast<double>(r.device_total_bytes)).c_str(),
        human_bytes(static_cast<double>(r.device_planned_bytes)).c_str());
  if (world_ > 1) {
    std::printf("communication per step (median): %.1f ms gradient %s, %.1f ms exposed%s\n",
                1e3 * r.comm_seconds,
                o_.parallel.zero && o_.optimizer.name != "muon" ? "reduce-scatter" : "all-reduce",
                1e3 * r.exposed_seconds,
                o_.parallel.ep > 1
                    ? (", " + fmt(1e3 * r.alltoall_seconds, 1) + " ms expert all-to-all").c_str()
                    : "");
  }
  if (cp_ > 1)
    std::printf("context parallelism per step (median): %.1f ms in K/V gathers, dK/dV "
                "reduce-scatters and halo exchanges, %.1f ms of it in halos (not overlapped)\n",
                1e3 * r.context_seconds, 1e3 * r.context_halo_seconds);
  if (r.part_seconds.contains("gemm") && o_.model.device == "cpu") {
    const auto part = [&](const char* name) { return 1e3 * r.part_seconds.at(name).get<double>(); };
    std::printf(
        "step time by part (median): GEMMs %.1f ms, attention %.1f, experts %.1f, other "
        "layer work %.1f, optimizer %.1f\n",
        part("gemm"), part("attention"), part("experts"), part("other"), part("optimizer"));
  }
  if (!r.last_checkpoint.empty()) std::printf("checkpoint: %s\n", r.last_checkpoint.c_str());
  std::fflush(stdout);
}

TrainResult run_training(const TrainOptions& options, parallel::DataParallelGroup* dp) {
  Trainer trainer(options, dp);
  return trainer.run();
}

}  // namespace anvil::train
