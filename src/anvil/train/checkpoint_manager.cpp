#include "anvil/train/checkpoint_manager.hpp"

#include <cstdio>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/ckpt/checkpoint.hpp"

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
  if (o_.resume.empty()) return std::nullopt;
  const std::string dir = ckpt::newest_intact_checkpoint(
      o_.resume == "latest" ? o_.out : o_.resume, [this](const std::string& why) {
        if (rank_ == 0) std::fprintf(stderr, "anvil: warning: %s\n", why.c_str());
      });
  if (dir.empty()) return std::nullopt;
  ResumePoint p;
  p.dir = dir;
  p.state = ckpt::read_state(dir);
  p.weights_only = p.state.value("weights_only", false);
  p.step = p.weights_only ? 0 : p.state.at("step").get<int64_t>();
  check_continues(p, run);
  return p;
}

void CheckpointManager::check_continues(const ResumePoint& p, const RunRecord& run) const {
  const std::string what = "checkpoint.resume: " + p.dir;
  json saved = p.state.at("config"), mine = run.config;
  if (o_.resume_new_phase) {  // a new phase may extend the context
    for (const char* k : {"rope_theta", "seq_len"}) saved.erase(k), mine.erase(k);
  }
  if (mine.dump() != saved.dump())
    throw InputError(what +
                     ": the checkpoint's model config differs from model.config with "
                     "the given model.set overrides");
  if (p.weights_only) return;
  // The weights are replicated and a step's rows depend only on their count
  // (data/batches.hpp), so any split of the same rows per step (batch x
  // ranks x accum) continues the trajectory: fewer ranks with more
  // accumulation after an elastic restart, or more ranks with less.
  const auto saved_accum = p.state.at("accum").get<int64_t>();
  const auto saved_split = p.state.at("batch").get<int64_t>() * p.state.value("world", int64_t{1});
  const auto saved_rows = saved_split * saved_accum;
  const auto rows = run.batch * run.world * run.accum;
  if (p.state.value("precision", "fp32") != run.precision ||
      p.state.value("optimizer", "adamw") != run.optimizer)
    throw InputError(what + ": model.dtype and optimizer.name must match the checkpoint's");
  if (!o_.resume_new_phase &&
      (p.state.at("seed").get<uint64_t>() != run.seed || p.state.at("seq").get<int64_t>() != run.seq ||
       (saved_rows != rows && !o_.resume_new_accum))) {
    throw InputError(what + ": train.seed, train.seq and the rows per step (train.batch x ranks x " +
                     "train.accum, " + std::to_string(saved_rows) + " in the checkpoint, " +
                     std::to_string(rows) + " here), model.dtype and optimizer.name must match " +
                     "the checkpoint's to continue its trajectory (another global batch: add " +
                     "checkpoint.resume_new_accum)");
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
