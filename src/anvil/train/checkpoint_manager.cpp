#include "anvil/train/checkpoint_manager.hpp"

#include <cstdio>
#include <filesystem>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/model_tensors.hpp"
#include "anvil/data/tokens.hpp"

namespace anvil::train {

using json = nlohmann::json;

std::string state_json(const RunRecord& run, int64_t step, const json& extra_state) {
  json s = {{"format", "anvil-train-state"},
            {"version", 1},
            {"step", step},
            {"config", run.config},
            {"seed", run.seed},
            {"batch", run.batch},
            {"world", run.world},
            {"seq", run.seq},
            {"accum", run.accum},
            {"precision", run.precision},
            {"optimizer", run.optimizer},
            {"data", run.data},
            {"tokenizer", run.tokenizer},
            {"phase", run.phase},
            {"device", run.device},
            {"schedule",
             {{"kind", run.schedule.kind},
              {"lr", run.schedule.lr},
              {"warmup", run.schedule.warmup},
              {"total", run.schedule.total}}}};
  if (!run.phase.empty()) s["phase_steps"] = {run.phase_first, run.phase_last};
  s.update(extra_state);
  return s.dump(2) + "\n";
}

CheckpointManager::CheckpointManager(const CheckpointOptions& options, int rank, int world,
                                     std::string nonce, const ft::Injector& injector, bool report)
    : o_(options),
      rank_(rank),
      world_(world),
      nonce_(std::move(nonce)),
      injector_(injector),
      report_(report) {}

CheckpointManager::~CheckpointManager() {
  if (saver_.joinable()) saver_.join();
}

std::optional<ResumePoint> CheckpointManager::resume_point(const RunRecord& run) const {
  if (o_.resume.empty()) {
    // A fresh run into a run directory with checkpoints would replace some
    // of them and leave the others for a later --resume latest to mix in.
    const auto held = o_.out.empty() ? std::vector<std::string>{} : ckpt::checkpoint_dirs(o_.out);
    if (!held.empty())
      throw InputError("checkpoint.out: " + o_.out + " already holds checkpoints (newest " +
                       std::filesystem::path(held.back()).filename().string() +
                       "); expected checkpoint.resume latest to continue that run, or a run "
                       "directory without step-* checkpoints");
    return std::nullopt;
  }
  std::string dir;
  try {
    dir = ckpt::newest_intact_checkpoint(
        o_.resume == "latest" ? o_.out : o_.resume,
        [this](const std::string& why) {
          if (rank_ == 0) std::fprintf(stderr, "anvil: warning: %s\n", why.c_str());
        },
        ckpt::model_tensor_problems);
  } catch (const InputError& e) {
    throw InputError("checkpoint.resume: " + std::string(e.what()));
  }
  if (dir.empty()) return std::nullopt;
  ResumePoint p;
  p.dir = dir;
  p.state = ckpt::read_state(dir);
  p.weights_only = p.state.value("weights_only", false);
  p.step = p.weights_only ? 0 : p.state.at("step").get<int64_t>();
  check_continues(p, run);
  return p;
}

void CheckpointManager::check_continues(ResumePoint& p, const RunRecord& run) const {
  const std::string what = "checkpoint.resume: " + p.dir;
  json saved = p.state.at("config"), mine = run.config;
  if (o_.resume_new_phase) {  // a new phase may extend the context
    for (const char* k : {"rope_theta", "seq_len"}) saved.erase(k), mine.erase(k);
  }
  // Every field that differs, with both values, so the flag to change is plain.
  std::string differ;
  auto differs = [&differ](const std::string& field, const json& here, const json& there) {
    auto text = [](const json& v) { return v.is_null() ? std::string("absent") : v.dump(); };
    if (here != there)
      differ += (differ.empty() ? "" : ", ") + field + " " + text(here) + " here, " + text(there) +
                " in the checkpoint";
  };
  for (const auto& [k, v] : saved.items()) differs(k, mine.value(k, json()), v);
  for (const auto& [k, v] : mine.items())
    if (!saved.contains(k)) differs(k, v, json());
  if (!differ.empty())
    throw InputError(what + ": the model config (model.config with its model.set overrides) " +
                     "differs from the checkpoint's: " + differ);
  if (p.weights_only) return;
  // The weights are replicated and a step's rows depend only on their count
  // (data/batches.hpp), so any split of the same rows per step (batch x
  // ranks x accum) continues the trajectory: fewer ranks with more
  // accumulation after an elastic restart, or more ranks with less.
  const auto saved_accum = p.state.at("accum").get<int64_t>();
  const auto saved_split = p.state.at("batch").get<int64_t>() * p.state.value("world", int64_t{1});
  const auto saved_rows = saved_split * saved_accum;
  const auto rows = run.batch * run.world * run.accum;
  differs("model.dtype", run.precision, p.state.value("precision", "fp32"));
  differs("optimizer.name", run.optimizer, p.state.value("optimizer", "adamw"));
  if (!differ.empty())
    throw InputError(what + ": " + differ + " (a checkpoint resumes in its own precision and " +
                     "optimizer)");
  if (o_.resume_new_phase) {
    // A new phase starts its own data order and batch: nothing more to match.
  } else {
    differs("train.seed", run.seed, p.state.at("seed").get<uint64_t>());
    differs("train.seq", run.seq, p.state.at("seq").get<int64_t>());
    const bool seed_and_seq = differ.empty();
    if (!o_.resume_new_accum)
      differs("rows per step (train.batch x ranks x train.accum)", rows, saved_rows);
    if (!differ.empty())
      throw InputError(what + ": " + differ + "; they must match to continue its trajectory" +
                       (seed_and_seq ? " (another global batch on purpose: add "
                                       "checkpoint.resume_new_accum)"
                                     : ""));
  }
  // Token ids of another tokenizer would mean other text to the weights (and
  // the run directory's tokenizer.model would no longer decode its earlier
  // checkpoints): refused, for a new phase too. Random tokens match anything.
  const std::string saved_tokenizer = p.state.value("tokenizer", "");
  if (!saved_tokenizer.empty() && saved_tokenizer != "random" && run.tokenizer != "random" &&
      !data::same_tokenizer(saved_tokenizer, ckpt::tokenizer_model(p.dir), run.tokenizer,
                            run.tokenizer_model))
    throw InputError("train.data: its tokenizer (" + run.tokenizer +
                     (run.tokenizer_model.empty() ? "" : " " + run.tokenizer_model) +
                     ") is not the one " + p.dir + " trained with (" + saved_tokenizer +
                     "); expected data of that tokenizer");
  // Other data is a choice (a new mixture), but not the trajectory the
  // checkpoint's run was on: said, not refused.
  if (!o_.resume_new_phase && report_ && p.state.contains("data") &&
      p.state["data"] != json(run.data)) {
    const auto shown = [](const json& d) {
      return d.is_string() && !d.get<std::string>().empty() ? d.get<std::string>()
                                                            : std::string("random tokens");
    };
    p.warnings.push_back("the checkpoint trained on " + shown(p.state["data"]) +
                         "; continuing on " + shown(json(run.data)) +
                         " (another data order than its run's)");
  }
  // Another learning-rate schedule (a longer --steps stretches a cosine) is
  // a choice too, but the rate jumps at the resume step: said, with both.
  if (!o_.resume_new_phase && report_ && p.state.contains("schedule")) {
    const json& had = p.state["schedule"];
    optim::Schedule before = run.schedule;
    before.kind = had.value("kind", before.kind);
    before.lr = had.value("lr", before.lr);
    before.warmup = had.value("warmup", before.warmup);
    before.total = had.value("total", before.total);
    std::string changed;
    const auto note = [&changed](const char* name, const json& now, const json& then) {
      if (now != then)
        changed += (changed.empty() ? "" : ", ") + std::string(name) + " " + then.dump() + " -> " +
                   now.dump();
    };
    note("kind", run.schedule.kind, before.kind);
    note("lr", run.schedule.lr, before.lr);
    note("warmup", run.schedule.warmup, before.warmup);
    // A constant rate has no length.
    if (run.schedule.kind != "constant" || before.kind != "constant")
      note("total", run.schedule.total, before.total);
    if (!changed.empty()) {
      char rates[128];
      std::snprintf(rates, sizeof rates, "%.3g, %.3g", run.schedule.at(p.step), before.at(p.step));
      p.warnings.push_back("the learning-rate schedule differs from the checkpoint's (" + changed +
                           "): the rate at step " + std::to_string(p.step + 1) + " is " + rates +
                           " on the checkpoint's schedule");
    }
  }
  const std::string saved_device = p.state.value("device", "cpu");
  if (saved_device != run.device && report_)
    std::printf("checkpoint written on %s, continuing on %s (its pieces are fp32 on any device)\n",
                saved_device.c_str(), run.device.c_str());
  if (saved_rows != rows && !o_.resume_new_phase && report_)
    std::printf("global batch ramp: %lld -> %lld rows per step (accum %lld -> %lld)\n",
                static_cast<long long>(saved_rows), static_cast<long long>(rows),
                static_cast<long long>(saved_accum), static_cast<long long>(run.accum));
}

void CheckpointManager::save(int64_t step, ckpt::ShardedSave save, const RunRecord& run,
                             const json& extra_state) {
  if (o_.out.empty()) return;
  wait();  // one save at a time
  save.state_json = state_json(run, step, extra_state);
  save.layout = run.layout;
  ckpt::SaveGroup group;
  group.rank = rank_;
  group.world = world_;
  group.nonce = nonce_;
  const std::string dir = o_.out;
  group.before_retry = [this, step, dir] { injector_.save_retry(step, dir); };
  const int keep = o_.keep;
  if (rank_ == 0) last_ = dir + "/" + ckpt::checkpoint_name(step);
  auto write = [this, dir, step, keep, group, save = std::move(save)] {
    try {
      std::string note;
      ckpt::save_sharded(dir, step, save, group, keep, &note);
      // Every rank that made room says so, as for a save that failed: the
      // rank that met the full disk first and pruned need not be rank 0.
      if (!note.empty())
        std::fprintf(stderr, "anvil: warning: rank %d: checkpoint of step %lld: %s\n", rank_,
                     static_cast<long long>(step), note.c_str());
    } catch (...) {
      save_error_ = std::current_exception();
    }
  };
  saving_step_ = step;
  injector_.save_begin(step, dir);
  if (o_.sync_save) {
    write();
    wait();
  } else {
    saver_ = std::thread(std::move(write));
  }
  const std::string final_dir = dir + "/" + ckpt::checkpoint_name(step);
  injector_.save_end(
      step, [this] { wait(); }, final_dir + "/index.json",
      final_dir + "/" + ckpt::shard_file(rank_));
}

double CheckpointManager::wait(bool final) {
  const double t0 = now_seconds();
  if (saver_.joinable()) saver_.join();
  if (!save_error_) return now_seconds() - t0;
  const auto error = std::exchange(save_error_, nullptr);
  if (final || o_.on_save_error != "continue") {
    try {
      std::rethrow_exception(error);
    } catch (const SystemError& e) {  // the step, the cause and what is left to resume from
      const auto dirs = ckpt::checkpoint_dirs(o_.out);
      throw SystemError("the checkpoint of step " + std::to_string(saving_step_) +
                        " was not saved: " + e.what() + "; the newest checkpoint is " +
                        (dirs.empty() ? std::string("none") : dirs.back()) +
                        (final ? "" : " (--on-save-error stop)"));
    }
  }
  try {
    std::rethrow_exception(error);
  } catch (const SystemError& e) {
    // The run goes on; its newest intact checkpoint is the one before.
    ++failed_saves_;
    if (rank_ == 0) last_.clear();
    std::fprintf(stderr,
                 "anvil: warning: rank %d: the checkpoint of step %lld was not saved (%s); "
                 "training on (--on-save-error continue), the next save tries again\n",
                 rank_, static_cast<long long>(saving_step_), e.what());
  }
  return now_seconds() - t0;
}

}  // namespace anvil::train
