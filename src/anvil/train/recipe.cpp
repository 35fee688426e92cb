#include "anvil/train/recipe.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/model/config.hpp"
#include "anvil/parallel/data_parallel.hpp"

namespace anvil::train {
using json = nlohmann::json;

namespace {

// Typed reads of a recipe object; errors name the file and the key.
struct Reader {
  const std::string& path;
  std::string where;  // "phases[1]." etc.
  InputError bad(const std::string& key, const std::string& why) const {
    return InputError(path + ": " + where + key + ": " + why);
  }
  double number(const json& j, const char* key, double fallback, double lo, double hi) const {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number()) throw bad(key, j[key].dump() + " (expected a number)");
    const double v = j[key].get<double>();
    if (!(v >= lo && v <= hi))
      throw bad(key, j[key].dump() + " (expected " + std::to_string(lo) + ".." +
                         std::to_string(hi) + ")");
    return v;
  }
  int64_t integer(const json& j, const char* key, int64_t fallback, int64_t lo) const {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo)
      throw bad(key, j[key].dump() + " (expected an integer >= " + std::to_string(lo) + ")");
    return j[key].get<int64_t>();
  }
  std::string text(const json& j, const char* key, const std::string& fallback) const {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_string()) throw bad(key, j[key].dump() + " (expected a string)");
    return j[key].get<std::string>();
  }
};

const char* const kTopKeys[] = {"name",           "config",      "set",       "sources", "seed",
                                "optimizer",      "ckpt_every",  "val_every", "phases",  "lr",
                                "batch",          "accum",       "seq",       "warmup",  "schedule",
                                "decay_fraction", "min_lr_ratio", "cp"};
const char* const kPhaseKeys[] = {"name",           "tokens",       "seq", "batch",  "accum",
                                  "rope_theta",     "mixture",      "lr",  "warmup", "schedule",
                                  "decay_fraction", "min_lr_ratio", "cp"};

template <size_t N>
void check_keys(const json& j, const char* const (&known)[N], const Reader& r) {
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* n : known) ok = ok || k == n;
    if (!ok) throw r.bad(k, "unknown key");
  }
}

}  // namespace

Recipe load_recipe(const std::string& path, int world) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
  Reader top{path, ""};
  if (!j.is_object()) throw InputError(path + ": expected a JSON object (a recipe)");
  check_keys(j, kTopKeys, top);
  Recipe r;
  r.path = path;
  r.name = top.text(j, "name", std::filesystem::path(path).stem().string());
  r.config = top.text(j, "config", "");
  if (r.config.empty()) throw top.bad("config", "missing (expected a model config path)");
  if (j.contains("set")) {
    if (!j["set"].is_array()) throw top.bad("set", "expected a list of \"key=value\" strings");
    for (const auto& s : j["set"]) {
      if (!s.is_string()) throw top.bad("set", s.dump() + " (expected \"key=value\")");
      r.set.push_back(s.get<std::string>());
    }
  }
  if (!j.contains("sources") || !j["sources"].is_object() || j["sources"].empty())
    throw top.bad("sources", "missing (expected {\"name\": \"token file\", ...})");
  for (const auto& [name, file] : j["sources"].items()) {
    if (!file.is_string()) throw top.bad("sources." + name, "expected a token file path");
    r.sources[name] = file.get<std::string>();
  }
  r.seed = static_cast<uint64_t>(top.integer(j, "seed", 1234, 0));
  r.optimizer = top.text(j, "optimizer", "adamw");
  if (r.optimizer != "adamw" && r.optimizer != "muon")
    throw top.bad("optimizer", r.optimizer + " (expected adamw or muon)");
  r.ckpt_every = top.integer(j, "ckpt_every", 0, 0);
  r.val_every = top.integer(j, "val_every", 0, 0);
  r.model = model::load_model_config(r.config, r.set);
  const model::ModelConfig& config = r.model;
  if (!j.contains("phases") || !j["phases"].is_array() || j["phases"].empty())
    throw top.bad("phases", "missing (expected a list of phases)");
  int64_t step = 0, tokens = 0;
  for (size_t i = 0; i < j["phases"].size(); ++i) {
    const json& pj = j["phases"][i];
    Reader rd{path, "phases[" + std::to_string(i) + "]."};
    if (!pj.is_object())
      throw InputError(path + ": phases[" + std::to_string(i) + "]: expected an object");
    check_keys(pj, kPhaseKeys, rd);
    // Phase keys fall back to the recipe's top-level ones.
    auto num = [&](const char* k, double dflt, double lo, double hi) {
      return rd.number(pj, k, top.number(j, k, dflt, lo, hi), lo, hi);
    };
    auto integer = [&](const char* k, int64_t dflt, int64_t lo) {
      return rd.integer(pj, k, top.integer(j, k, dflt, lo), lo);
    };
    Phase p;
    p.name = rd.text(pj, "name", "phase" + std::to_string(i + 1));
    p.tokens = rd.integer(pj, "tokens", 0, 1);
    if (p.tokens == 0) throw rd.bad("tokens", "missing (expected the phase's token budget)");
    p.seq = integer("seq", config.seq_len, 1);
    p.batch = integer("batch", 4, 1);
    p.accum = integer("accum", 1, 1);
    p.rope_theta = num("rope_theta", 0, 0, 1e12);
    p.cp = integer("cp", 1, 1);
    if (world % p.cp != 0)
      throw rd.bad("cp", std::to_string(p.cp) + " (expected a divisor of the " +
                             std::to_string(world) + " ranks: run the recipe under mpirun -np " +
                             std::to_string(p.cp) + " or a multiple)");
    if (p.cp > 1 && (p.seq % (2 * p.cp) != 0 || p.seq / (2 * p.cp) < 2))
      throw rd.bad("seq", std::to_string(p.seq) + " (cp " + std::to_string(p.cp) +
                              " cuts a sequence into " + std::to_string(2 * p.cp) +
                              " chunks of >= 2 tokens: expected a multiple of " +
                              std::to_string(2 * p.cp) + ")");
    if ((p.seq > config.seq_len || p.rope_theta > 0) && config.position != model::Position::rope)
      throw rd.bad(p.rope_theta > 0 ? "rope_theta" : "seq",
                   "context extension needs RoPE; " + r.config + " has " +
                       model::to_string(config.position) + " positions (seq_len " +
                       std::to_string(config.seq_len) + ")");
    p.schedule.kind = rd.text(pj, "schedule", top.text(j, "schedule", "wsd"));
    p.schedule.lr = num("lr", 3e-4, 1e-12, 10);
    p.schedule.warmup = integer("warmup", 0, 0);
    p.schedule.decay_fraction = num("decay_fraction", 0.2, 0, 1);
    p.schedule.min_lr_ratio = num("min_lr_ratio", 0.1, 0, 1);
    optim::validate(p.schedule, path + ": " + rd.where + "schedule");
    if (!pj.contains("mixture")) {
      if (r.sources.size() != 1) throw rd.bad("mixture", "missing (expected {\"source\": weight})");
      p.mixture[r.sources.begin()->first] = 1;
    } else {
      if (!pj["mixture"].is_object() || pj["mixture"].empty())
        throw rd.bad("mixture", "expected {\"source\": weight, ...}");
      for (const auto& [name, w] : pj["mixture"].items()) {
        if (!r.sources.count(name))
          throw rd.bad("mixture." + name, "not one of the recipe's sources");
        if (!w.is_number() || !(w.get<double>() >= 0))
          throw rd.bad("mixture." + name, w.dump() + " (expected a weight >= 0)");
        if (w.get<double>() > 0) p.mixture[name] = w.get<double>();
      }
      if (p.mixture.empty()) throw rd.bad("mixture", "every weight is 0");
    }
    const int64_t per_step = p.batch * p.accum * p.seq * (world / p.cp);  // over the replicas
    p.steps = (p.tokens + per_step - 1) / per_step;
    p.first_step = step;
    p.tokens_before = tokens;
    p.schedule.start = step;
    p.schedule.total = p.steps;
    if (p.schedule.warmup >= p.steps && p.steps > 1)
      throw rd.bad("warmup", std::to_string(p.schedule.warmup) + " steps (the phase has " +
                                 std::to_string(p.steps) + ")");
    step += p.steps;
    tokens += p.steps * per_step;
    r.phases.push_back(p);
  }
  return r;
}

TrainOptions phase_options(const Recipe& r, size_t i, const TrainOptions& base) {
  const Phase& p = r.phases[i];
  TrainOptions o = base;
  o.model.config = r.config;
  o.model.set = r.set;
  if (p.rope_theta > 0) o.model.set.push_back("rope_theta=" + std::to_string(p.rope_theta));
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
    from = ckpt::newest_intact_checkpoint(base.checkpoint.out, [](const std::string& why) {
      std::fprintf(stderr, "anvil: warning: %s\n", why.c_str());
    });
    at = ckpt::read_state(from).at("step").get<int64_t>();
  }
  const bool speak = !base.metrics.quiet && (dp == nullptr || dp->rank() == 0);
  TrainResult all;
  bool first_run = true;
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
          "recipe %s: phase %zu/%zu '%s': steps %lld..%lld, %lld tokens, seq %lld, "
          "batch %lld x %lld%s, %s lr %.2e%s\n",
          r.name.c_str(), i + 1, r.phases.size(), p.name.c_str(),
          static_cast<long long>(p.first_step + 1), static_cast<long long>(p.first_step + p.steps),
          static_cast<long long>(p.tokens), static_cast<long long>(p.seq),
          static_cast<long long>(p.batch), static_cast<long long>(p.accum),
          p.cp > 1 ? (", cp " + std::to_string(p.cp)).c_str() : "", p.schedule.kind.c_str(),
          p.schedule.lr,
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
    if (dp != nullptr) {  // every rank past rank 0's commit of the phase's last checkpoint
      double one = 1;
      dp->sum(std::span<double>(&one, 1));
    }
    if (trainer.current_step() < o.train.steps) break;  // stopped by a signal
    at = trainer.current_step();
    from = (std::filesystem::path(base.checkpoint.out) / ckpt::checkpoint_name(at)).string();
  }
  return all;
}

}  // namespace anvil::train
