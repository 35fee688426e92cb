#include "anvil/train/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/rng.hpp"
#include "anvil/base/table.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/data/tokens.hpp"
#include "anvil/kernels/gemm.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/zaya_model.hpp"

namespace anvil::train {
namespace {

using json = nlohmann::json;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
    const double t0 = now();
    if (precision == model::Precision::bf16) {
      kernels::gemm(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    } else {
      kernels::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    }
    best = std::min(best, now() - t0);
  }
  return 2.0 * n * n * n / best / 1e9;
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

// Where training and validation batches come from. Training rows start at
// offsets drawn from (seed, step, micro, row); validation rows are fixed and
// evenly spaced over the held-out tail.
class Batches {
 public:
  Batches(const std::string& path, int64_t vocab, uint64_t seed, int64_t T, double val_fraction)
      : seed_(seed), T_(T), vocab_(vocab) {
    if (path.empty()) return;
    data_ = std::make_unique<data::TokenData>(path);
    // Every id is below the file's vocabulary (checked when it was opened),
    // so this keeps every input and target inside the model's.
    if (data_->vocab_size() > vocab) {
      throw InputError(path + ": vocabulary " + std::to_string(data_->vocab_size()) +
                       " exceeds the model's vocab_size " + std::to_string(vocab) +
                       " (expected <= " + std::to_string(vocab) + ")");
    }
    const int64_t n = data_->size();
    val_begin_ = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));
    if (val_begin_ < T + 1 || (val_fraction > 0 && n - val_begin_ < T + 1)) {
      throw InputError(path + ": " + std::to_string(n) + " tokens are too few for sequences of " +
                       std::to_string(T) + " with a validation fraction of " +
                       std::to_string(val_fraction));
    }
  }
  bool has_data() const { return data_ != nullptr; }
  bool has_validation() const { return data_ != nullptr && val_begin_ < data_->size(); }
  std::string tokenizer() const { return data_ ? data_->tokenizer() : "random"; }

  void train_row(int64_t step, int64_t micro, int64_t row, int64_t B, int32_t* tokens,
                 int32_t* targets) const {
    const uint64_t index = static_cast<uint64_t>((step * 4096 + micro) * B + row);
    if (!data_) {  // random tokens: throughput benchmarks without a corpus
      for (int64_t t = 0; t <= T_; ++t) {
        const auto tok = static_cast<int32_t>(random_u64(seed_, index, t) % vocab_);
        if (t < T_) tokens[t] = tok;
        if (t > 0) targets[t - 1] = tok;
      }
      return;
    }
    const int64_t span = val_begin_ - T_ - 1;
    const int64_t off = static_cast<int64_t>(random_u64(seed_, stream_id("train"), index) %
                                             static_cast<uint64_t>(span + 1));
    data_->copy(tokens, off, T_);
    data_->copy(targets, off + 1, T_);
  }
  void val_row(int64_t i, int64_t count, int32_t* tokens, int32_t* targets) const {
    const int64_t span = data_->size() - val_begin_ - T_ - 1;
    const int64_t off = val_begin_ + (count > 1 ? span * i / (count - 1) : 0);
    data_->copy(tokens, off, T_);
    data_->copy(targets, off + 1, T_);
  }

 private:
  uint64_t seed_;
  int64_t T_, vocab_;
  std::unique_ptr<data::TokenData> data_;
  int64_t val_begin_ = 0;
};

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

TrainResult run_training(const TrainOptions& o) {
  const model::ModelConfig config = model::load_model_config(o.config, o.overrides);
  const int64_t B = o.batch, T = o.seq == 0 ? config.seq_len : o.seq;
  if (B < 1) throw InputError("--batch: expected >= 1");
  if (T < 1 || T > config.seq_len) {
    throw InputError("--seq: expected 1.." + std::to_string(config.seq_len) +
                     " (the config's seq_len), got " + std::to_string(T));
  }
  if (o.accum < 1) throw InputError("--accum: expected >= 1");
  if (o.steps < 1) throw InputError("--steps: expected >= 1");
  optim::validate(o.schedule, "--schedule");
  Batches batches(o.data, config.vocab_size, o.seed, T, o.val_fraction);

  const model::Precision precision = model::parse_precision(o.precision, "--precision");
  TrainResult result;
  result.peak_gflops = o.peak_gflops > 0 ? o.peak_gflops : measure_peak_gflops(precision);
  result.flops_per_token = model::training_flops_per_token(config, T);

  std::unique_ptr<model::TrainableModel> model_owner;
  if (config.attention == "cca") {
    if (precision != model::Precision::fp32) {
      throw InputError("--precision bf16: the ZAYA1 model runs in fp32 only so far");
    }
    model_owner = std::make_unique<model::ZayaModel>(config, B, T, o.balancing);
  } else {
    model_owner = std::make_unique<model::Decoder>(config, B, T, /*training=*/true, precision);
  }
  model::TrainableModel& model = *model_owner;
  if (o.optimizer != "adamw" && o.optimizer != "muon") {
    throw InputError("--optimizer: expected adamw or muon, got '" + o.optimizer + "'");
  }
  const bool use_muon = o.optimizer == "muon";
  optim::AdamW adamw(model.registry(), o.adamw, /*skip_muon_group=*/use_muon);
  std::unique_ptr<optim::Muon> muon;
  if (use_muon) muon = std::make_unique<optim::Muon>(model.registry(), o.muon);
  const size_t optimizer_bytes = adamw.state_bytes() + (muon ? muon->state_bytes() : 0);
  const auto& plan = model.plan();
  result.planned_bytes =
      plan.parameters + plan.gradients + optimizer_bytes + plan.activations + plan.low_precision;
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  if (!o.quiet) {
    std::printf("model %s: %s parameters (%lld tensors), batch %lldx%lld, accum %lld\n",
                config.name.c_str(), fmt(static_cast<double>(model.registry().total()), 0).c_str(),
                static_cast<long long>(model.registry().specs().size()), static_cast<long long>(B),
                static_cast<long long>(T), static_cast<long long>(o.accum));
    std::printf(
        "memory plan: parameters %s | gradients %s | optimizer %s | activations %s | total %s\n",
        human_bytes(plan.parameters).c_str(), human_bytes(plan.gradients).c_str(),
        human_bytes(optimizer_bytes).c_str(), human_bytes(plan.activations).c_str(),
        human_bytes(result.planned_bytes).c_str());
    std::printf(
        "data: %s (%s); MFU against a measured %s GEMM peak of %.1f GFLOP/s; %.3f GFLOP/token\n",
        o.data.empty() ? "random tokens" : o.data.c_str(), batches.tokenizer().c_str(),
        o.precision.c_str(), result.peak_gflops, result.flops_per_token / 1e9);
    if (precision == model::Precision::bf16 || (use_muon && o.muon.ns_bf16)) {
      std::printf("bf16 GEMM: %s\n",
                  kernels::bf16_path_description(kernels::bf16_path()).c_str());
    }
    std::fflush(stdout);
  }

  // Start: fresh init or a checkpoint.
  int64_t start = 0;
  const std::string resume_from =
      o.resume.empty() ? "" : ckpt::resolve_checkpoint(o.resume == "latest" ? o.out_dir : o.resume);
  if (!resume_from.empty()) {
    const json state = ckpt::read_state(resume_from);
    const std::string saved = state.at("config").dump();
    if (json::parse(model::model_config_to_json(config)).dump() != saved) {
      throw InputError("--resume " + resume_from + ": the checkpoint's model config differs from " +
                       o.config + " with the given --set overrides");
    }
    const auto saved_accum = state.at("accum").get<int64_t>();
    if (state.at("seed").get<uint64_t>() != o.seed || state.at("batch").get<int64_t>() != B ||
        state.at("seq").get<int64_t>() != T || (saved_accum != o.accum && !o.resume_new_accum) ||
        state.value("precision", "fp32") != o.precision ||
        state.value("optimizer", "adamw") != o.optimizer) {
      throw InputError("--resume " + resume_from +
                       ": seed, batch, seq, accum, precision and optimizer must match the "
                       "checkpoint's to continue its trajectory (a different --accum: add "
                       "--resume-new-accum)");
    }
    if (saved_accum != o.accum && !o.quiet)
      std::printf("global batch ramp: accum %lld -> %lld\n", static_cast<long long>(saved_accum),
                  static_cast<long long>(o.accum));
    ckpt::load_checkpoint(resume_from, model.registry(), model.params(), adamw.exp_avg(),
                          adamw.exp_avg_sq(), muon ? muon->momentum() : nullptr,
                          model.extra_state());
    start = state.at("step").get<int64_t>();
    if (!o.quiet)
      std::printf("resumed from %s at step %lld\n", resume_from.c_str(),
                  static_cast<long long>(start));
  } else {
    model.registry().initialize(model.params(), o.seed);
  }
  result.first_step = start;

  std::unique_ptr<std::ofstream> metrics;
  if (!o.out_dir.empty()) {
    std::filesystem::create_directories(o.out_dir);
    truncate_metrics(o.out_dir + "/metrics.jsonl", start);
    metrics = std::make_unique<std::ofstream>(o.out_dir + "/metrics.jsonl", std::ios::app);
    if (!*metrics) throw SystemError(o.out_dir + "/metrics.jsonl: cannot open for appending");
  }
  auto state_json = [&](int64_t step) {
    json s = {{"format", "anvil-train-state"},
              {"version", 1},
              {"step", step},
              {"config", json::parse(model::model_config_to_json(config))},
              {"seed", o.seed},
              {"batch", B},
              {"seq", T},
              {"accum", o.accum},
              {"precision", o.precision},
              {"optimizer", o.optimizer},
              {"data", o.data},
              {"tokenizer", batches.tokenizer()},
              {"schedule",
               {{"kind", o.schedule.kind},
                {"lr", o.schedule.lr},
                {"warmup", o.schedule.warmup},
                {"total", o.schedule.total}}}};
    return s.dump(2) + "\n";
  };
  auto checkpoint = [&](int64_t step) {
    if (o.out_dir.empty()) return;
    ckpt::CheckpointData d{&model.registry(),
                           model.params(),
                           adamw.exp_avg(),
                           adamw.exp_avg_sq(),
                           muon ? muon->momentum() : nullptr,
                           model.extra_state(),
                           state_json(step)};
    result.last_checkpoint = ckpt::save_checkpoint(o.out_dir, step, d, o.keep);
  };
  auto validate = [&]() {
    if (!batches.has_validation()) return -1.0;
    std::vector<int32_t> tok(B * T), tgt(B * T);
    double sum = 0;
    int64_t count = 0;
    // Whole micro-batches (--val-batches rounded up to a multiple of B), so
    // every model runs the shape it planned for.
    const int64_t val_rows = (o.val_batches + B - 1) / B * B;
    for (int64_t i = 0; i < val_rows; i += B) {
      for (int64_t r = 0; r < B; ++r) batches.val_row(i + r, val_rows, &tok[r * T], &tgt[r * T]);
      int64_t scored = 0;
      sum += model.forward(tok.data(), tgt.data(), B, T, &scored);
      count += scored;
    }
    return sum / static_cast<double>(count);
  };

  g_stop.store(false);
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  const auto grad_scale = static_cast<float>(1.0 / static_cast<double>(B * T * o.accum));
  const double tokens_per_step = static_cast<double>(B * T * o.accum);
  const double t_run = now();
  int64_t step = start;
  for (; step < o.steps && !g_stop.load(); ++step) {
    const double t0 = now();
    model.zero_grads();
    double loss_sum = 0;
    int64_t scored_total = 0;
    for (int64_t m = 0; m < o.accum; ++m) {
      for (int64_t r = 0; r < B; ++r)
        batches.train_row(step, m, r, B, &tokens[r * T], &targets[r * T]);
      int64_t scored = 0;
      loss_sum += model.forward_backward(tokens.data(), targets.data(), B, T, grad_scale, &scored);
      scored_total += scored;
    }
    const double loss = loss_sum / static_cast<double>(scored_total);
    const double norm = optim::global_norm(model.grads(), model.registry().total());
    const double lr = o.schedule.at(step);
    const float coef = optim::clip_coefficient(norm, o.clip);
    adamw.update(model.params(), model.grads(), static_cast<float>(lr), step + 1, coef);
    if (muon) muon->update(model.params(), model.grads(), static_cast<float>(lr), coef);
    model.after_step(step + 1);
    const double dt = now() - t0;
    result.losses.push_back(loss);
    result.step_seconds.push_back(dt);
    const double tps = tokens_per_step / dt;
    const double mfu = tps * result.flops_per_token / (result.peak_gflops * 1e9);
    double val = -1;
    const bool last = step + 1 == o.steps;
    if ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last) val = validate();
    if (last) result.val_loss = val;
    if (metrics) {
      json m = {{"step", step + 1}, {"loss", loss},
                {"lr", lr},         {"grad_norm", norm},
                {"seconds", dt},    {"tokens_per_s", tps},
                {"mfu", mfu},       {"tokens", (step + 1) * static_cast<int64_t>(tokens_per_step)}};
      if (val >= 0) m["val_loss"] = val;
      m.update(model.step_metrics());
      *metrics << m.dump() << "\n";
      metrics->flush();
    }
    if (!o.quiet) {
      const double eta = dt * static_cast<double>(o.steps - step - 1);
      char line[384];
      std::snprintf(line, sizeof line,
                    "step %lld/%lld | loss %.4f | lr %.2e | grad-norm %.3f | %.0f tok/s | MFU "
                    "%.1f%% | ETA %s",
                    static_cast<long long>(step + 1), static_cast<long long>(o.steps), loss, lr,
                    norm, tps, 100 * mfu, format_eta(eta).c_str());
      const std::string note = model.progress_note();
      if (!note.empty()) {
        std::strncat(line, (" | " + note).c_str(), sizeof line - std::strlen(line) - 1);
      }
      if (tty) {
        std::printf("\r%s\x1b[K", line);
        if (val >= 0 || last) std::printf("\n");
      } else if ((step + 1) % std::max<int64_t>(1, o.log_every) == 0 || last || step == start) {
        std::printf("%s\n", line);
      }
      if (val >= 0)
        std::printf("validation loss %.4f at step %lld\n", val, static_cast<long long>(step + 1));
      std::fflush(stdout);
    }
    if (o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0 && !last) checkpoint(step + 1);
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (step > start) checkpoint(step);
  if (g_stop.load() && !o.quiet) {
    std::printf("\nstopped by a signal at step %lld%s\n", static_cast<long long>(step),
                o.out_dir.empty() ? "" : "; checkpoint written");
  }
  (void)t_run;
  // Throughput: the median step, leaving out the first (warm-up) when there are more.
  std::vector<double> times(result.step_seconds.begin() + (result.step_seconds.size() > 1 ? 1 : 0),
                            result.step_seconds.end());
  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    result.tokens_per_second = tokens_per_step / median;
    result.mfu = result.tokens_per_second * result.flops_per_token / (result.peak_gflops * 1e9);
  }
  result.peak_rss_bytes = peak_rss_bytes();
  if (!o.quiet) {
    std::printf("done: %lld steps, median %.0f tok/s, MFU %.1f%%, peak RSS %s (plan %s)\n",
                static_cast<long long>(step - start), result.tokens_per_second, 100 * result.mfu,
                human_bytes(result.peak_rss_bytes).c_str(),
                human_bytes(result.planned_bytes).c_str());
    if (!result.last_checkpoint.empty())
      std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
  }
  return result;
}

}  // namespace anvil::train
