// The trainer's checkpoints: the state.json schema (what identifies a run's
// trajectory), the rules for resuming (which checkpoint, and whether it
// continues this run), and saving — every rank its share, written by a
// background thread while the next step computes. The tensors themselves
// are the sharded format's (ckpt/sharded.hpp).
#pragma once

#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "anvil/ckpt/sharded.hpp"
#include "anvil/ft/injector.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/train/options.hpp"

namespace anvil::train {

// What a checkpoint records about the run that wrote it (state.json), and
// what a resumed run must share with it to continue its trajectory.
struct RunRecord {
  nlohmann::json config;  // the model config with its overrides
  uint64_t seed = 0;
  int64_t batch = 0, seq = 0, accum = 1;
  int world = 1;
  std::string precision, optimizer, data, tokenizer, phase;
  // A recipe phase's steps, first and last (state.json's phase_steps): a
  // resume checks the recipe still puts the phase there.
  int64_t phase_first = 0, phase_last = 0;
  std::string tokenizer_model;  // its model file ("" for bytes and random tokens)
  // The device the run trains on ("cpu", "cuda"). A checkpoint holds fp32
  // pieces whatever it was, so any device resumes it; state.json says which.
  std::string device = "cpu";
  optim::Schedule schedule;
  nlohmann::json layout;  // index.json's: world, zero, ep, optimizer, batch, accum
};

// A checkpoint's state.json read for resuming.
struct ResumePoint {
  std::string dir;
  int64_t step = 0;
  bool weights_only = false;  // anvil ckpt import: weights, no trajectory
  nlohmann::json state;
  // What the run changes of the checkpoint's on purpose (other data, another
  // schedule): printed once the checkpoint has loaded, so that a checkpoint
  // that fails to load is one error line.
  std::vector<std::string> warnings;
};

class CheckpointManager {
 public:
  // `report`: print what happens (rank 0 of a run that is not quiet).
  CheckpointManager(const CheckpointOptions& options, int rank, int world, std::string nonce,
                    const ft::Injector& injector, bool report);
  ~CheckpointManager();

  // Where to resume from: the newest intact checkpoint of --resume (latest:
  // of --out; damaged newer ones are named on stderr and skipped), or none.
  // Its state.json must describe `run`: the same model config (a new phase
  // may change rope_theta and seq_len), precision and optimizer, and unless
  // a new phase or a weights-only import, the same seed, sequence length
  // and rows per step (batch x ranks x accum, split any way; another count
  // with resume_new_accum).
  std::optional<ResumePoint> resume_point(const RunRecord& run) const;

  // Starts writing the checkpoint of `step`: this rank's pieces (`save`'s
  // model and optimizer lists) and, with the state.json of `run` plus
  // `extra_state`, the commit. Returns once the write has started (or, with
  // sync_save, finished).
  void save(int64_t step, ckpt::ShardedSave save, const RunRecord& run,
            const nlohmann::json& extra_state);
  // Waits for a background save; the seconds waited. Its error is rethrown
  // unless --on-save-error continue and it is a SystemError (a full disk, a
  // failed rank): then it is reported and counted, and training goes on.
  // `final`: the last save of the run, whose error is always rethrown.
  double wait(bool final = false);
  int failed_saves() const { return failed_saves_; }
  bool enabled() const { return !o_.out.empty(); }
  const std::string& last() const { return last_; }

 private:
  void check_continues(ResumePoint& p, const RunRecord& run) const;

  CheckpointOptions o_;
  int rank_, world_;
  std::string nonce_;
  const ft::Injector& injector_;
  bool report_;
  std::string last_;
  int64_t saving_step_ = 0;
  int failed_saves_ = 0;
  std::thread saver_;
  std::exception_ptr save_error_;
};

// state.json of `run` at `step`, with the components' `extra_state` keys.
std::string state_json(const RunRecord& run, int64_t step, const nlohmann::json& extra_state);

}  // namespace anvil::train
