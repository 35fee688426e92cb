#include "anvil/train/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <thread>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/table.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/parallel/data_parallel.hpp"
#include "anvil/parallel/expert_parallel.hpp"
#include "anvil/parallel/grad_reducer.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/zaya_model.hpp"

namespace anvil::train {
namespace {

using json = nlohmann::json;

// The TensorBoard tags of a metrics record: its scalars under train/,
// perf/ and val/, and per ZAYA1 MoE layer the router's load spread, skip
// rate and entropy.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const json& m) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& [key, tag] : {std::pair{"loss", "train/loss"},
                                 {"lr", "train/lr"},
                                 {"grad_norm", "train/grad_norm"},
                                 {"tokens_per_s", "perf/tokens_per_s"},
                                 {"mfu", "perf/mfu"},
                                 {"val_loss", "val/loss"}})
    if (m.contains(key)) v.emplace_back(tag, m[key].get<double>());
  for (const auto& l : m.value("router", json::array())) {
    const std::string layer = "router/layer" + l["layer"].dump() + "/";
    for (const char* k : {"max_over_min", "skip_rate", "entropy"})
      if (l.contains(k) && l[k].is_number()) v.emplace_back(layer + k, l[k].get<double>());
  }
  return v;
}

// A buffer outside the registry as one whole replicated tensor.
model::TensorShard whole_shard(const model::ExtraTensor& e) {
  int64_t n = 1;
  for (const int64_t d : e.shape) n *= d;
  return {e.name, e.shape, 0, n, 0, model::Sharding::replicated, e.data};
}

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

// The GEMM rate MFU is measured against: best of a few 2048^3 products in
// the precision the matrix multiplies run in (fp32, or bf16 inputs).
double measure_peak_gflops(model::Precision precision) {
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<bf16> a16(precision == model::Precision::bf16 ? n * n : 0, to_bf16(0.5f));
  std::vector<bf16> b16(a16.size(), to_bf16(0.25f));
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    const double t0 = now_seconds();
    if (precision == model::Precision::bf16) {
      device::gemm(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    } else {
      device::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    }
    best = std::min(best, now_seconds() - t0);
  }
  return 2.0 * n * n * n / best / 1e9;
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

// metrics.jsonl keeps one line per step of the trajectory this run
// continues: lines past `start` (a run that went further before this one
// resumed from an earlier step, or a fresh run in an old directory) go. The
// whole previous file stays as metrics.jsonl.N (a hard link, else a copy)
// before the kept lines replace it atomically (temporary, fsync, rename).
void truncate_metrics(const std::string& path, int64_t start) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const std::string old = read_file(path);
  std::string kept;
  bool dropped = false;
  for (size_t pos = 0; pos < old.size();) {
    size_t end = old.find('\n', pos);
    const bool whole = end != std::string::npos;  // a line cut by a crash is not
    if (!whole) end = old.size();
    const std::string_view line(old.data() + pos, end - pos);
    const json m = whole ? json::parse(line, nullptr, /*allow_exceptions=*/false) : json();
    const auto step = m.is_object() ? m.find("step") : m.end();
    if (step != m.end() && step->is_number_integer() && step->get<int64_t>() <= start) {
      kept.append(line).push_back('\n');
    } else {
      dropped = true;
    }
    pos = end + 1;
  }
  if (!dropped) return;
  for (int i = 1;; ++i) {
    const std::string rotated = path + "." + std::to_string(i);
    if (::link(path.c_str(), rotated.c_str()) == 0) break;
    if (errno == EEXIST) continue;
    write_file_atomic(rotated, old);  // a file system without hard links
    break;
  }
  write_file_atomic(path, kept);
}

std::string format_eta(double seconds) {
  char buf[32];
  const auto s = static_cast<long long>(seconds);
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace

Trainer::Trainer(const TrainOptions& o, parallel::DataParallelGroup* dp)
    : o_(o),
      dp_(dp),
      rank_(dp ? dp->rank() : 0),
      world_(dp ? dp->size() : 1),
      config_(model::load_model_config(o.config, o.overrides)),
      B_(o.batch),
      T_(o.seq == 0 ? config_.seq_len : o.seq),
      batches_(data::parse_sources(o.data, "--data"), config_.vocab_size, o.seed, T_,
               o.val_fraction) {
  // This job's nonce: rank 0's clock, the same on every rank.
  int64_t nonce = rank_ == 0 ? static_cast<int64_t>(now_seconds() * 1e6) % 1000000000000 : 0;
  if (dp_ && world_ > 1) dp_->sum(std::span<int64_t>(&nonce, 1));
  nonce_ = std::to_string(nonce);
  if (B_ < 1) throw InputError("--batch: expected >= 1");
  if (T_ < 1 || T_ > config_.seq_len) {
    throw InputError("--seq: expected 1.." + std::to_string(config_.seq_len) +
                     " (the config's seq_len), got " + std::to_string(T_));
  }
  if (o.accum < 1) throw InputError("--accum: expected >= 1");
  if (o.steps < 1) throw InputError("--steps: expected >= 1");
  if (!(o.bucket_mib > 0)) throw InputError("--bucket-mib: expected > 0");
  optim::validate(o.schedule, "--schedule");
  if (o.optimizer != "adamw" && o.optimizer != "muon") {
    throw InputError("--optimizer: expected adamw or muon, got '" + o.optimizer + "'");
  }
  precision_ = model::parse_precision(o.precision, "--precision");
  result_.world = world_;
  result_.peak_gflops = o.peak_gflops > 0 ? o.peak_gflops : measure_peak_gflops(precision_);
  result_.flops_per_token = model::training_flops_per_token(config_, T_);

  if (config_.attention == "cca") {
    // Under --ep K each rank holds the weights of its E/K experts only.
    model::ExpertRange experts;
    if (o.ep > 1) {
      if (!dp_) throw InputError("--ep: expected a run under mpirun with a multiple of --ep ranks");
      if (config_.n_experts % o.ep != 0) {
        throw InputError("--ep: " + std::to_string(o.ep) + " does not divide the " +
                         std::to_string(config_.n_experts) +
                         " experts (expected a divisor of n_experts)");
      }
      dp_->expert_group(o.ep);  // checks that --ep divides the ranks
      experts.count = config_.n_experts / o.ep;
      experts.first = rank_ % o.ep * experts.count;
    }
    // Under --ep every MoE layer's dispatcher is an all-to-all over the group.
    model::MakeDispatcher dispatcher;
    std::shared_ptr<parallel::AllToAllDispatcher::Scratch> scratch;  // the first layer's, for all
    if (o.ep > 1) {
      comm::Communicator& group = dp_->expert_group(o.ep);
      dispatcher = [&group, &scratch](const model::ZayaMoeShape& shape, int64_t tokens) {
        auto d = std::make_unique<parallel::AllToAllDispatcher>(group, shape, tokens, scratch);
        scratch = d->scratch();
        return d;
      };
    }
    auto zaya = std::make_unique<model::ZayaModel>(config_, B_, T_, o.balancing, experts,
                                                   precision_, dispatcher);
    zaya_ = zaya.get();
    model_ = std::move(zaya);
  } else {
    model_ = std::make_unique<model::Decoder>(config_, B_, T_, /*training=*/true, precision_);
  }
  if (o.ep > 1 && zaya_ == nullptr) {
    throw InputError("--ep: expert parallelism needs a MoE (ZAYA1) config");
  }
  const bool use_muon = o.optimizer == "muon";
  if (dp_ && world_ > 1) {
    // The experts' gradients (one range per MoE layer) are summed over the
    // ranks holding the same experts; everything else over all ranks.
    std::vector<parallel::ReduceRange> expert_ranges;
    if (o.ep > 1) {
      for (const auto& spec : model_->registry().specs()) {
        if (spec.sharding != model::Sharding::expert) continue;
        if (!expert_ranges.empty() && expert_ranges.back().end == spec.offset) {
          expert_ranges.back().end += spec.numel;
        } else {
          expert_ranges.push_back(
              {spec.offset, spec.offset + spec.numel, &dp_->expert_data_async()});
        }
      }
    }
    reducer_ = std::make_unique<parallel::GradReducer>(
        dp_->async(), model_->grads(), model_->registry().total(),
        std::max<int64_t>(1, static_cast<int64_t>(o.bucket_mib * (1 << 20) / sizeof(float))),
        // With Muon a matrix is updated whole by its owner, so every rank
        // needs every summed gradient: the buckets are all-gathered too.
        o.zero && !use_muon, comm::Algo::automatic, expert_ranges);
  }
  adamw_ = std::make_unique<optim::AdamW>(
      model_->registry(), o.adamw, /*skip_muon_group=*/use_muon,
      reducer_ && o.zero ? reducer_->owned() : std::vector<optim::AdamW::Range>{});
  if (use_muon) {
    muon_ =
        std::make_unique<optim::Muon>(model_->registry(), o.muon, rank_, world_, std::max(1, o.ep));
  }
  tokens_.resize(static_cast<size_t>(B_ * T_));
  targets_.resize(static_cast<size_t>(B_ * T_));

  const size_t optimizer_bytes = adamw_->state_bytes() + (muon_ ? muon_->state_bytes() : 0);
  result_.optimizer_bytes = optimizer_bytes;
  result_.parameter_bytes = model_->plan().parameters;
  const auto& plan = model_->plan();
  result_.planned_bytes =
      plan.parameters + plan.gradients + optimizer_bytes + plan.activations + plan.low_precision;
  // mpirun gives rank 0 a pseudo-terminal even when its own output is a file.
  tty_ = ::isatty(STDOUT_FILENO) != 0 && dp_ == nullptr;
  if (!o.quiet && rank_ == 0) {
    std::printf(
        "model %s: %s parameters (%lld tensors), batch %lldx%lld, accum %lld", config_.name.c_str(),
        fmt(static_cast<double>(model_->registry().total()), 0).c_str(),
        static_cast<long long>(model_->registry().specs().size()), static_cast<long long>(B_),
        static_cast<long long>(T_), static_cast<long long>(o.accum));
    if (world_ > 1) {
      std::printf(
          ", %d data-parallel ranks (global batch %lld rows; %d threads each; %lld "
          "gradient buckets)",
          world_, static_cast<long long>(B_ * o.accum * world_), num_threads(),
          static_cast<long long>(reducer_->bucket_count()));
    }
    std::printf("\n");
    std::printf(
        "memory plan%s: parameters %s | gradients %s | optimizer %s | activations %s | total %s\n",
        world_ > 1 ? " per rank" : "", human_bytes(plan.parameters).c_str(),
        human_bytes(plan.gradients).c_str(), human_bytes(optimizer_bytes).c_str(),
        human_bytes(plan.activations).c_str(), human_bytes(result_.planned_bytes).c_str());
    std::printf(
        "data: %s (%s); MFU against a measured %s GEMM peak of %.1f GFLOP/s; %.3f GFLOP/token\n",
        o.data.empty() ? "random tokens" : o.data.c_str(), batches_.tokenizer().c_str(),
        o.precision.c_str(), result_.peak_gflops, result_.flops_per_token / 1e9);
    if (precision_ == model::Precision::bf16 || (use_muon && o.muon.ns_bf16)) {
      std::printf("bf16 GEMM: %s\n", device::bf16_path_description(device::bf16_path()).c_str());
    }
    std::fflush(stdout);
  }

  // The newest intact checkpoint; damaged newer ones are named and skipped.
  const std::string from =
      o.resume.empty()
          ? ""
          : ckpt::newest_intact_checkpoint(
                o.resume == "latest" ? o.out_dir : o.resume, [this](const std::string& why) {
                  if (rank_ == 0) std::fprintf(stderr, "anvil: warning: %s\n", why.c_str());
                });
  if (!from.empty()) {
    resume(from);
  } else {
    model_->registry().initialize(model_->params(), o.seed);
  }
  result_.first_step = step_;
  if (!o.heartbeat_dir.empty()) std::filesystem::create_directories(o.heartbeat_dir);
  heartbeat(std::numeric_limits<double>::quiet_NaN());  // alive, before the first step
  if (!o.out_dir.empty() && rank_ == 0) {
    std::filesystem::create_directories(o.out_dir);
    // The run decodes with the tokenizer it trained on (anvil generate, eval).
    if (!batches_.tokenizer_model().empty())
      write_file_atomic(o.out_dir + "/" + ckpt::kTokenizerFile,
                        read_file(batches_.tokenizer_model()));
    truncate_metrics(o.out_dir + "/metrics.jsonl", step_);
    metrics_ = std::make_unique<std::ofstream>(o.out_dir + "/metrics.jsonl", std::ios::app);
    if (!*metrics_) throw SystemError(o.out_dir + "/metrics.jsonl: cannot open for appending");
  }
  if (!o.tensorboard_dir.empty() && rank_ == 0)
    events_ = std::make_unique<EventWriter>(o.tensorboard_dir);
}

Trainer::~Trainer() {
  if (saver_.joinable()) saver_.join();
}

void Trainer::resume(const std::string& from) {
  const json state = ckpt::read_state(from);
  json saved = state.at("config"), mine = json::parse(model::model_config_to_json(config_));
  if (o_.resume_new_phase) {  // a new phase may extend the context
    for (const char* k : {"rope_theta", "seq_len"}) saved.erase(k), mine.erase(k);
  }
  if (mine.dump() != saved.dump()) {
    throw InputError("--resume " + from + ": the checkpoint's model config differs from " +
                     o_.config + " with the given --set overrides");
  }
  if (state.value("weights_only", false)) {  // anvil ckpt import: weights, no trajectory
    std::vector<model::TensorShard> want =
        model_->registry().shards(model_->params(), {{0, model_->registry().total()}});
    for (const auto& e : model_->extra_state())
      if (!e.optimizer_state) want.push_back(whole_shard(e));
    ckpt::load_pieces(from, want);
    step_ = 0;
    if (!o_.quiet && rank_ == 0)
      std::printf("starting from the weights of %s (fresh optimizer state, step 0)\n",
                  from.c_str());
    return;
  }
  // The weights are replicated, so any rank count continues the trajectory
  // whose micro-batch holds the same global rows (batch x ranks).
  const auto saved_accum = state.at("accum").get<int64_t>();
  const auto saved_rows = state.at("batch").get<int64_t>() * state.value("world", int64_t{1});
  const bool new_phase = o_.resume_new_phase;
  if (state.value("precision", "fp32") != o_.precision ||
      state.value("optimizer", "adamw") != o_.optimizer) {
    throw InputError("--resume " + from + ": precision and optimizer must match the checkpoint's");
  }
  if (!new_phase &&
      (state.at("seed").get<uint64_t>() != o_.seed || saved_rows != B_ * world_ ||
       state.at("seq").get<int64_t>() != T_ || (saved_accum != o_.accum && !o_.resume_new_accum))) {
    throw InputError("--resume " + from +
                     ": seed, batch x ranks, seq, accum, precision and optimizer must match the "
                     "checkpoint's to continue its trajectory (a different --accum: add "
                     "--resume-new-accum)");
  }
  if (saved_accum != o_.accum && !new_phase && !o_.quiet && rank_ == 0)
    std::printf("global batch ramp: accum %lld -> %lld\n", static_cast<long long>(saved_accum),
                static_cast<long long>(o_.accum));
  // Every rank reads all the weights and the optimizer state it keeps, from
  // whatever layout wrote them.
  std::vector<model::TensorShard> want =
      model_->registry().shards(model_->params(), {{0, model_->registry().total()}});
  for (const auto& e : model_->extra_state()) want.push_back(whole_shard(e));
  for (auto& piece : adamw_->state()) want.push_back(piece);
  if (muon_)
    for (auto& piece : muon_->state()) want.push_back(piece);
  ckpt::load_pieces(from, want);
  step_ = state.at("step").get<int64_t>();
  // The spike check's window, so a resumed run skips exactly what the
  // uninterrupted one would.
  if (state.contains("recent_losses") && state["recent_losses"].is_array())
    recent_losses_ = state["recent_losses"].get<std::vector<double>>();
  spikes_in_a_row_ = state.value("spikes_in_a_row", 0);
  if (!o_.quiet && rank_ == 0)
    std::printf("resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(step_));
}

std::string Trainer::state_json() const {
  json s = {{"format", "anvil-train-state"},
            {"version", 1},
            {"step", step_},
            {"config", json::parse(model::model_config_to_json(config_))},
            {"seed", o_.seed},
            {"batch", B_},
            {"world", world_},
            {"seq", T_},
            {"accum", o_.accum},
            {"precision", o_.precision},
            {"optimizer", o_.optimizer},
            {"recent_losses", recent_losses_},
            {"spikes_in_a_row", spikes_in_a_row_},
            {"data", o_.data},
            {"tokenizer", batches_.tokenizer()},
            {"phase", o_.phase},
            {"schedule",
             {{"kind", o_.schedule.kind},
              {"lr", o_.schedule.lr},
              {"warmup", o_.schedule.warmup},
              {"total", o_.schedule.total}}}};
  return s.dump(2) + "\n";
}

void Trainer::save() {
  if (o_.out_dir.empty()) return;
  wait_for_save();  // one save at a time
  // Each rank writes its share: the weights and replicated state in its
  // reducer blocks (the arena split evenly over the ranks), the optimizer
  // state it owns (ZeRO-1 ranges, its Muon matrices); rank 0 the extras.
  const auto& registry = model_->registry();
  const std::vector<std::pair<int64_t, int64_t>> mine =
      reducer_ ? reducer_->owned()
               : std::vector<std::pair<int64_t, int64_t>>{{0, registry.total()}};
  ckpt::ShardedSave save;
  save.model = registry.shards(model_->params(), mine);
  save.optimizer = adamw_->state(mine);
  if (muon_)
    for (auto& piece : muon_->state()) save.optimizer.push_back(piece);
  if (rank_ == 0)
    for (const auto& e : model_->extra_state())
      (e.optimizer_state ? save.optimizer : save.model).push_back(whole_shard(e));
  save.state_json = state_json();
  save.layout = {{"world", world_},           {"zero", o_.zero}, {"ep", o_.ep},
                 {"optimizer", o_.optimizer}, {"batch", B_},     {"accum", o_.accum}};
  ckpt::SaveGroup group;
  group.rank = rank_;
  group.world = world_;
  group.nonce = nonce_;
  const std::string dir = o_.out_dir;
  const int64_t step = step_;
  const int keep = o_.keep;
  if (rank_ == 0) result_.last_checkpoint = dir + "/" + ckpt::checkpoint_name(step);
  auto write = [this, dir, step, keep, group, save = std::move(save)] {
    try {
      ckpt::save_sharded(dir, step, save, group, keep);
    } catch (...) {
      save_error_ = std::current_exception();
    }
  };
  const bool fault_at_save = o_.inject && o_.inject->rank == rank_ && o_.inject->step == step_;
  if (fault_at_save && o_.inject->kind == "kill-in-save") {
    // Dies while its part is being written (the job never commits this step).
    const auto ms = static_cast<int64_t>(o_.inject->arg);
    std::thread([ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      std::raise(SIGKILL);
    }).detach();
  }
  if (o_.async_save) {
    saver_ = std::thread(std::move(write));
  } else {
    write();
    wait_for_save();
  }
  if (fault_at_save && o_.inject->kind == "corrupt-ckpt") {
    // Once the step is committed, one byte of this rank's first shard flips
    // and the job dies: a restart must find the damage and go back further.
    wait_for_save();
    const std::string final_dir = dir + "/" + ckpt::checkpoint_name(step);
    while (!std::filesystem::exists(final_dir + "/index.json"))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::string file = final_dir + "/" + ckpt::shard_file(rank_);
    if (FILE* f = std::fopen(file.c_str(), "r+b")) {
      unsigned char len[8] = {};
      if (std::fread(len, 1, 8, f) == 8) {
        uint64_t header = 0;
        for (int i = 7; i >= 0; --i) header = header << 8 | len[i];
        std::fseek(f, static_cast<long>(8 + header + 2), SEEK_SET);
        const int c = std::fgetc(f);
        std::fseek(f, static_cast<long>(8 + header + 2), SEEK_SET);
        std::fputc(c ^ 0x5a, f);
      }
      std::fclose(f);
    }
    std::raise(SIGKILL);
  }
}

double Trainer::wait_for_save() {
  const double t0 = now_seconds();
  if (saver_.joinable()) saver_.join();
  if (save_error_) std::rethrow_exception(std::exchange(save_error_, nullptr));
  return now_seconds() - t0;
}

bool Trainer::strikes(const char* kind) const {
  return o_.inject && o_.inject->kind == kind && o_.inject->rank == rank_ &&
         (o_.inject->kind == std::string("slow") ? step_ + 1 >= o_.inject->step
                                                 : step_ + 1 == o_.inject->step);
}

void Trainer::heartbeat(double loss) {
  if (o_.heartbeat_dir.empty()) return;
  // Small, renamed into place (no fsync: a supervisor on this machine reads it).
  char line[128];
  const auto unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::snprintf(line, sizeof line, "%lld %.3f %.9g\n", static_cast<long long>(step_), unix_s, loss);
  const std::string path = o_.heartbeat_dir + "/rank-" + std::to_string(rank_);
  const std::string tmp = path + ".tmp";
  if (std::isnan(loss)) {  // the first: where this attempt starts
    const std::string start = o_.heartbeat_dir + "/start-" + std::to_string(rank_);
    if (FILE* f = std::fopen(start.c_str(), "w")) {
      std::fputs(line, f);
      std::fclose(f);
    }
  }
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(line, f);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

StepStats Trainer::step() {
  const double t0 = now_seconds();
  if (strikes("slow"))
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>(o_.inject->arg * 1e3)));
  model_->zero_grads();
  // Loss over the global batch: summed token losses and scored tokens.
  double sums[2] = {0, 0};
  const auto grad_scale =
      static_cast<float>(1.0 / static_cast<double>(B_ * T_ * o_.accum * world_));
  for (int64_t m = 0; m < o_.accum; ++m) {
    batches_.train_micro_batch(step_, m, rank_, world_, B_, tokens_.data(), targets_.data());
    // The last micro-batch's backward hands finished gradients to the reducer.
    const bool last = m + 1 == o_.accum;
    if (reducer_ && last) {
      reducer_->begin();
      model_->set_grads_ready_hook([this](int64_t offset) { reducer_->ready_from(offset); });
    }
    int64_t scored = 0;
    sums[0] +=
        model_->forward_backward(tokens_.data(), targets_.data(), B_, T_, grad_scale, &scored);
    sums[1] += static_cast<double>(scored);
    if (reducer_ && last) model_->set_grads_ready_hook({});
  }
  if (strikes("nan")) sums[0] = std::numeric_limits<double>::quiet_NaN();
  StepStats s;
  if (zaya_) s.alltoall_seconds = zaya_->take_dispatch_seconds();
  if (reducer_) {
    const parallel::ReduceTimes t = reducer_->finish();
    s.comm_seconds = t.comm_seconds;
    s.exposed_seconds = t.exposed_seconds;
    dp_->sum(sums);
    dp_->sum(model_->step_counts());
  }
  s.step = step_ + 1;
  s.loss = sums[0] / sums[1];
  s.grad_norm = reducer_ ? distributed_norm()
                         : optim::global_norm(model_->grads(), model_->registry().total());
  s.lr = o_.schedule.at(step_);
  const float coef = optim::clip_coefficient(s.grad_norm, o_.clip);
  // The loss and norm are global: every rank decides the same here.
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "step %lld: loss %.6g, gradient norm %.6g (not finite); roll back to the last "
                  "checkpoint",
                  static_cast<long long>(s.step), s.loss, s.grad_norm);
    throw ft::TrainingFault(what, ft::kExitNonFinite);
  }
  s.skipped = is_spike(s.loss);
  // A background save still reading the weights and moments finishes first.
  s.save_wait_seconds = wait_for_save();
  if (!s.skipped) {
    adamw_->update(model_->params(), model_->grads(), static_cast<float>(s.lr), step_ + 1, coef);
    if (adamw_->sharded()) reducer_->gather(model_->params());
    if (muon_) {
      muon_->update(model_->params(), model_->grads(), static_cast<float>(s.lr), coef);
      if (world_ > 1) broadcast_muon_matrices(model_->params());
    }
    model_->after_step(step_ + 1);
  }
  ++step_;
  s.seconds = now_seconds() - t0;
  heartbeat(s.loss);
  if (strikes("kill")) std::raise(SIGKILL);
  if (strikes("hang"))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  return s;
}

bool Trainer::is_spike(double loss) {
  if (o_.spike_z <= 0) return false;
  const auto n = recent_losses_.size();
  bool spike = false;
  if (static_cast<int>(n) >= o_.spike_window) {
    double mean = 0, var = 0;
    for (double x : recent_losses_) mean += x;
    mean /= static_cast<double>(n);
    for (double x : recent_losses_) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / static_cast<double>(n - 1));
    spike = sd > 0 && (loss - mean) / sd > o_.spike_z;
  }
  if (!spike) {
    spikes_in_a_row_ = 0;
    recent_losses_.push_back(loss);
    if (static_cast<int>(recent_losses_.size()) > o_.spike_window)
      recent_losses_.erase(recent_losses_.begin());
    return false;
  }
  if (++spikes_in_a_row_ >= o_.max_spikes) {
    throw ft::TrainingFault("step " + std::to_string(step_ + 1) + ": " +
                                std::to_string(spikes_in_a_row_) +
                                " loss spike(s) in a row; roll back to the last checkpoint",
                            ft::kExitSpikes);
  }
  if (!o_.quiet && rank_ == 0)
    std::fprintf(
        stderr, "\nanvil: warning: step %lld: loss %.4f spikes above the last %d; update skipped\n",
        static_cast<long long>(step_ + 1), loss, o_.spike_window);
  return true;
}

void Trainer::broadcast_muon_matrices(float* data) {
  // Distributed Muon: each matrix was orthogonalised and updated by its
  // owner, which alone keeps its momentum; its weights (or, for a
  // checkpoint, its momentum) go from there to every rank.
  // Under --ep an expert's matrix lives on the ranks holding that expert
  // only, and goes out over their group (world rank r is r / ep there).
  const auto& specs = model_->registry().specs();
  const auto& owners = muon_->owners();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (owners[i] < 0) continue;
    const auto n = static_cast<size_t>(specs[i].numel);
    if (o_.ep > 1 && specs[i].sharding == model::Sharding::expert) {
      comm::Communicator& group = dp_->expert_data_group();
      if (group.size() > 1)
        group.broadcast(data + specs[i].offset, n, comm::DType::f32, owners[i] / o_.ep,
                        comm::Algo::automatic);
    } else {
      dp_->comm().broadcast(data + specs[i].offset, n, comm::DType::f32, owners[i],
                            comm::Algo::automatic);
    }
  }
}

double Trainer::distributed_norm() {
  // Each rank's share over its owned blocks, summed in rank order: the same
  // bits with ZeRO-1 (where only those blocks are reduced here) and without.
  double mine = 0;
  for (const auto& [begin, end] : reducer_->owned()) {
    mine += optim::sum_of_squares(model_->grads() + begin, end - begin);
  }
  double total = 0;
  for (double x : dp_->gather(mine)) total += x;
  return std::sqrt(total);
}

double Trainer::validate() {
  if (!batches_.has_validation()) return -1.0;
  // Whole micro-batches on every rank (--val-batches rounded up to a
  // multiple of batch x ranks), each rank its share: the same rows on any
  // rank count with the same batch x ranks.
  const int64_t rows = B_ * world_;
  const int64_t val_rows = (o_.val_batches + rows - 1) / rows * rows;
  double sums[2] = {0, 0};
  for (int64_t i = 0; i < val_rows; i += rows) {
    for (int64_t r = 0; r < B_; ++r) {
      batches_.val_row(i + rank_ * B_ + r, val_rows, &tokens_[r * T_], &targets_[r * T_]);
    }
    int64_t scored = 0;
    sums[0] += model_->forward(tokens_.data(), targets_.data(), B_, T_, &scored);
    sums[1] += static_cast<double>(scored);
  }
  if (dp_ && world_ > 1) dp_->sum(sums);
  return sums[0] / sums[1];
}

bool Trainer::stop_requested() {
  // Every rank stops at the same step, whichever got the signal.
  if (!dp_ || world_ == 1) return g_stop.load();
  int64_t flag = g_stop.load() ? 1 : 0;
  dp_->sum(std::span<int64_t>(&flag, 1));
  return flag > 0;
}

void Trainer::log(const StepStats& s, double val) {
  const double tokens_per_step = static_cast<double>(B_ * T_ * o_.accum * world_);
  const double tps = tokens_per_step / s.seconds;
  const double mfu = tps * result_.flops_per_token / (result_.peak_gflops * 1e9 * world_);
  // Every rank's own peak memory and communication, for rank 0's metrics.
  std::vector<double> rss, comm, exposed;
  if (dp_ && world_ > 1 && !o_.out_dir.empty()) {
    rss = dp_->gather(static_cast<double>(peak_rss_bytes()));
    comm = dp_->gather(s.comm_seconds);
    exposed = dp_->gather(s.exposed_seconds);
  }
  if (rank_ != 0) return;
  if (metrics_ || events_) {  // one record of the step, for metrics.jsonl and TensorBoard
    json m = {{"step", s.step},
              {"loss", s.loss},
              {"lr", s.lr},
              {"grad_norm", s.grad_norm},
              {"seconds", s.seconds},
              {"tokens_per_s", tps},
              {"mfu", mfu},
              {"tokens", o_.tokens_before_phase + (s.step - o_.phase_first_step) *
                                                      static_cast<int64_t>(tokens_per_step)}};
    if (!o_.phase.empty()) m["phase"] = o_.phase;
    if (val >= 0) m["val_loss"] = val;
    if (s.save_wait_seconds > 1e-4) m["save_wait_s"] = s.save_wait_seconds;
    if (world_ > 1) {
      m["ranks"] = world_;
      m["comm_s"] = s.comm_seconds;
      m["comm_exposed_s"] = s.exposed_seconds;
      if (o_.ep > 1) m["alltoall_s"] = s.alltoall_seconds;
      m["rank_peak_rss_bytes"] = rss;
      m["rank_comm_s"] = comm;
      m["rank_comm_exposed_s"] = exposed;
    }
    m.update(model_->step_metrics());
    if (metrics_) {
      *metrics_ << m.dump() << "\n";
      metrics_->flush();
    }
    if (events_) events_->scalars(s.step, tensorboard_scalars(m));
  }
  if (o_.quiet) return;
  const bool last = s.step == o_.steps;
  const double eta = s.seconds * static_cast<double>(o_.steps - s.step);
  char line[384];
  std::snprintf(line, sizeof line,
                "step %lld/%lld | loss %.4f | lr %.2e | grad-norm %.3f | %.0f tok/s | MFU "
                "%.1f%% | ETA %s",
                static_cast<long long>(s.step), static_cast<long long>(o_.steps), s.loss, s.lr,
                s.grad_norm, tps, 100 * mfu, format_eta(eta).c_str());
  std::string note = model_->progress_note();
  if (world_ > 1) {
    char c[96];
    if (o_.ep > 1) {
      std::snprintf(c, sizeof c, "comm %.0f ms (%.0f exposed) | all-to-all %.0f ms",
                    1e3 * s.comm_seconds, 1e3 * s.exposed_seconds, 1e3 * s.alltoall_seconds);
    } else {
      std::snprintf(c, sizeof c, "comm %.0f ms (%.0f exposed)", 1e3 * s.comm_seconds,
                    1e3 * s.exposed_seconds);
    }
    note = note.empty() ? c : note + " | " + c;
  }
  if (!note.empty())
    std::strncat(line, (" | " + note).c_str(), sizeof line - std::strlen(line) - 1);
  if (tty_) {
    std::printf("\r%s\x1b[K", line);
    if (val >= 0 || last) std::printf("\n");
  } else if (s.step % std::max<int64_t>(1, o_.log_every) == 0 || last ||
             s.step == result_.first_step + 1) {
    std::printf("%s\n", line);
  }
  if (val >= 0)
    std::printf("validation loss %.4f at step %lld\n", val, static_cast<long long>(s.step));
  std::fflush(stdout);
}

TrainResult Trainer::run() {
  g_stop.store(false);
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  std::vector<double> comm, exposed, alltoall;
  while (step_ < o_.steps && !stop_requested()) {
    const StepStats s = step();
    alltoall.push_back(s.alltoall_seconds);
    result_.losses.push_back(s.loss);
    result_.step_seconds.push_back(s.seconds);
    comm.push_back(s.comm_seconds);
    exposed.push_back(s.exposed_seconds);
    const bool last = step_ == o_.steps;
    const bool val_now = (o_.val_every > 0 && step_ % o_.val_every == 0) || last;
    const double val = val_now ? validate() : -1;
    if (last) result_.val_loss = val;
    log(s, val);
    if (o_.ckpt_every > 0 && step_ % o_.ckpt_every == 0 && !last) save();
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (step_ > result_.first_step) save();
  wait_for_save();
  if (g_stop.load() && !o_.quiet && rank_ == 0) {
    std::printf("\nstopped by a signal at step %lld%s\n", static_cast<long long>(step_),
                o_.out_dir.empty() ? "" : "; checkpoint written");
  }
  // Throughput: the median step, leaving out the first (warm-up) when there are more.
  auto median_after_first = [](const std::vector<double>& v) {
    std::vector<double> t(v.begin() + (v.size() > 1 ? 1 : 0), v.end());
    if (t.empty()) return 0.0;
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double tokens_per_step = static_cast<double>(B_ * T_ * o_.accum * world_);
  const double median = median_after_first(result_.step_seconds);
  if (median > 0) {
    result_.tokens_per_second = tokens_per_step / median;
    result_.mfu =
        result_.tokens_per_second * result_.flops_per_token / (result_.peak_gflops * 1e9 * world_);
  }
  result_.comm_seconds = median_after_first(comm);
  result_.exposed_seconds = median_after_first(exposed);
  result_.alltoall_seconds = median_after_first(alltoall);
  result_.peak_rss_bytes = peak_rss_bytes();
  if (dp_ && world_ > 1)
    result_.rank_peak_rss_bytes = dp_->gather(static_cast<double>(result_.peak_rss_bytes));
  if (!o_.quiet && rank_ == 0) {
    std::printf("done: %lld steps, median %.0f tok/s, MFU %.1f%%, peak RSS %s%s (plan %s)\n",
                static_cast<long long>(step_ - result_.first_step), result_.tokens_per_second,
                100 * result_.mfu, human_bytes(result_.peak_rss_bytes).c_str(),
                world_ > 1 ? " on rank 0" : "", human_bytes(result_.planned_bytes).c_str());
    if (world_ > 1) {
      std::printf(
          "communication per step (median): %.1f ms all-reduce, %.1f ms exposed%s\n",
          1e3 * result_.comm_seconds, 1e3 * result_.exposed_seconds,
          o_.ep > 1
              ? (", " + fmt(1e3 * result_.alltoall_seconds, 1) + " ms expert all-to-all").c_str()
              : "");
    }
    if (!result_.last_checkpoint.empty())
      std::printf("checkpoint: %s\n", result_.last_checkpoint.c_str());
    std::fflush(stdout);
  }
  return result_;
}

TrainResult run_training(const TrainOptions& options, parallel::DataParallelGroup* dp) {
  Trainer trainer(options, dp);
  return trainer.run();
}

}  // namespace anvil::train
