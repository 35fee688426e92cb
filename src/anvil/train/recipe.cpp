#include "anvil/train/recipe.hpp"

#include <csignal>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/model_tensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/data/batches.hpp"
#include "anvil/data/tokens.hpp"
#include "anvil/model/config.hpp"
#include "anvil/parallel/data_parallel.hpp"

namespace anvil::train {
using json = nlohmann::json;

TrainOptions phase_options(const Recipe& r, size_t i, const TrainOptions& base) {
  const Phase& p = r.phases[i];
  TrainOptions o = base;
  o.model.config = r.config;
  o.model.set = r.set;
  if (p.rope_theta > 0) o.model.set.push_back("rope_theta=" + json(p.rope_theta).dump());
  if (r.model.position == model::Position::rope && p.seq > r.model.seq_len)
    o.model.set.push_back("seq_len=" + std::to_string(p.seq));
  o.train.data.clear();
  for (const auto& [name, w] : p.mixture) {
    char weight[32];
    std::snprintf(weight, sizeof weight, ":%g", w);
    o.train.data += (o.train.data.empty() ? "" : ",") + r.sources.at(name) + weight;
  }
  o.train.batch = p.batch;
  o.train.accum = p.accum;
  o.train.seq = p.seq;
  o.parallel.cp = static_cast<int>(p.cp);
  o.train.steps = p.first_step + p.steps;
  o.optimizer.schedule = p.schedule;
  o.train.seed = r.seed;
  o.optimizer.name = r.optimizer;
  o.checkpoint.every = r.ckpt_every;
  o.train.val_every = r.val_every;
  o.phase.name = p.name;
  o.phase.first_step = p.first_step;
  o.phase.tokens_before = p.tokens_before;
  o.checkpoint.resume.clear();
  o.checkpoint.resume_new_phase = false;
  return o;
}

TrainResult run_recipe(const Recipe& r, const TrainOptions& base, parallel::DataParallelGroup* dp) {
  if (base.checkpoint.out.empty())
    throw InputError(r.path +
                     ": a recipe needs checkpoint.out, the run directory (the phases "
                     "hand over through its checkpoints)");
  if (!base.checkpoint.resume.empty() && base.checkpoint.resume != "latest")
    throw InputError(
        "checkpoint.resume: with a recipe, expected 'latest' (the newest checkpoint "
        "in checkpoint.out)");
  // Where the run stands: the newest intact checkpoint's step.
  std::string from;
  int64_t at = 0;
  if (base.checkpoint.resume == "latest" && !ckpt::checkpoint_dirs(base.checkpoint.out).empty()) {
    const bool rank0 = dp == nullptr || dp->rank() == 0;
    from = ckpt::newest_intact_checkpoint(
        base.checkpoint.out,
        [rank0](const std::string& why) {
          if (rank0) std::fprintf(stderr, "anvil: warning: %s\n", why.c_str());
        },
        ckpt::model_tensor_problems);
    const json state = ckpt::read_state(from);
    at = state.at("step").get<int64_t>();
    // The phase that wrote the checkpoint is the one the recipe puts its step
    // in: an edited recipe that moved the boundaries would otherwise hand a
    // mid-phase checkpoint over as a finished phase, or the reverse.
    for (const Phase& p : r.phases) {
      if (at > p.first_step && at <= p.first_step + p.steps &&
          state.value("phase", p.name) != p.name)
        throw InputError(r.path + ": " + from + " (step " + std::to_string(at) +
                         ") was written in phase '" + state.value("phase", std::string()) +
                         "', which this recipe puts at other steps; expected the recipe the "
                         "run started with");
      // The same phase at other steps: its budget edited, or the plan made
      // for another rank count (steps come from the global tokens per step).
      const json span = state.value("phase_steps", json());
      if (at > p.first_step && at <= p.first_step + p.steps &&
          state.value("phase", std::string()) == p.name && span.is_array() && span.size() == 2 &&
          (span[0] != p.first_step + 1 || span[1] != p.first_step + p.steps))
        throw InputError(r.path + ": " + from + " was written in phase '" + p.name + "' at steps " +
                         span[0].dump() + ".." + span[1].dump() + "; this recipe on " +
                         std::to_string(dp ? dp->size() : 1) + " rank(s) puts it at " +
                         std::to_string(p.first_step + 1) + ".." +
                         std::to_string(p.first_step + p.steps) +
                         "; expected the recipe and rank count the run started with");
    }
  }
  // Every phase still to run is checked before the first one trains: its
  // model config with the phase's overrides, its sources against its
  // sequence, and one tokenizer over all of them (a later phase's bad input
  // would otherwise surface only after the earlier phases had trained).
  std::string tokenizer, tokenizer_model, first_phase;
  for (size_t i = 0; i < r.phases.size(); ++i) {
    const Phase& p = r.phases[i];
    if (at >= p.first_step + p.steps) continue;
    const TrainOptions o = phase_options(r, i, base);
    try {
      const model::ModelConfig c = model::load_model_config(o.model.config, o.model.set);
      const data::Batches b(data::parse_sources(o.train.data, "train.data"), c.vocab_size,
                            o.train.seed, o.train.seq, o.train.val_fraction);
      if (first_phase.empty()) {
        tokenizer = b.tokenizer();
        tokenizer_model = b.tokenizer_model();
        first_phase = p.name;
      } else if (!data::same_tokenizer(b.tokenizer(), b.tokenizer_model(), tokenizer,
                                       tokenizer_model)) {
        throw InputError("its sources' tokenizer (" + b.tokenizer() + ") differs from phase '" +
                         first_phase + "''s (" + tokenizer +
                         "); expected one tokenizer for the whole recipe");
      }
    } catch (const InputError& e) {
      throw InputError(r.path + ": phases[" + std::to_string(i) + "] ('" + p.name +
                       "'): " + e.what());
    }
  }
  const bool speak = !base.metrics.quiet && (dp == nullptr || dp->rank() == 0);
  TrainResult all;
  bool first_run = true;
  // A signal between phases, or in a phase's last step (whose run ends
  // complete), stops the recipe before the next phase, as it would stop a phase.
  const StopSignals signals;
  for (size_t i = 0; i < r.phases.size(); ++i) {
    const Phase& p = r.phases[i];
    if (at >= p.first_step + p.steps) continue;  // done before
    TrainOptions o = phase_options(r, i, base);
    if (at > 0) {
      o.checkpoint.resume = from;
      o.checkpoint.resume_new_phase = at == p.first_step;  // handed over from the previous phase
    }
    if (speak) {
      std::printf(
          "recipe %s: phase %zu/%zu '%s': steps %lld..%lld, %lld tokens%s, seq %lld, "
          "batch %lld x %lld%s, %s lr %.2e%s\n",
          r.name.c_str(), i + 1, r.phases.size(), p.name.c_str(),
          static_cast<long long>(p.first_step + 1), static_cast<long long>(p.first_step + p.steps),
          static_cast<long long>(p.trained_tokens),
          p.trained_tokens != p.tokens
              ? (" (budget " + std::to_string(p.tokens) + ", whole steps)").c_str()
              : "",
          static_cast<long long>(p.seq), static_cast<long long>(p.batch),
          static_cast<long long>(p.accum), p.cp > 1 ? (", cp " + std::to_string(p.cp)).c_str() : "",
          p.schedule.kind.c_str(), p.schedule.lr,
          p.rope_theta > 0 ? (", rope_theta " + json(p.rope_theta).dump()).c_str() : "");
      std::fflush(stdout);
    }
    Trainer trainer(o, dp);
    const TrainResult res = trainer.run();
    std::vector<double> losses = std::move(all.losses), seconds = std::move(all.step_seconds);
    losses.insert(losses.end(), res.losses.begin(), res.losses.end());
    seconds.insert(seconds.end(), res.step_seconds.begin(), res.step_seconds.end());
    const int64_t first = first_run ? res.first_step : all.first_step;
    all = res;
    all.losses = std::move(losses);
    all.step_seconds = std::move(seconds);
    all.first_step = first;
    first_run = false;
    // Every rank past rank 0's commit of the phase's last checkpoint, and
    // agreed on whether a signal came (any rank's stops them all).
    int signal = pending_stop_signal();
    if (dp != nullptr) {
      double got = signal;
      dp->sum(std::span<double>(&got, 1));
      if (got != 0 && signal == 0) signal = SIGTERM;
    }
    if (trainer.current_step() < o.train.steps) break;  // stopped by a signal
    if (signal != 0 && i + 1 < r.phases.size()) {
      all.stop_signal = signal;
      break;
    }
    at = trainer.current_step();
    from = (std::filesystem::path(base.checkpoint.out) / ckpt::checkpoint_name(at)).string();
  }
  return all;
}

}  // namespace anvil::train
