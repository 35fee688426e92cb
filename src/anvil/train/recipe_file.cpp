#include "anvil/train/recipe_file.hpp"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/json_text.hpp"

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
      throw bad(key, j[key].dump() + " (expected " + json(lo).dump() + ".." + json(hi).dump() +
                         ")");
    return v;
  }
  int64_t integer(const json& j, const char* key, int64_t fallback, int64_t lo) const {
    if (!j.contains(key)) return fallback;
    // A whole number written with an exponent (a budget of 8e12 tokens) is
    // one too, up to 2^53 where doubles still count every integer.
    const json& v = j[key];
    const bool whole_float = v.is_number_float() && std::isfinite(v.get<double>()) &&
                             v.get<double>() == std::floor(v.get<double>()) &&
                             std::fabs(v.get<double>()) <= 9007199254740992.0;
    if ((!v.is_number_integer() && !whole_float) ||
        (whole_float ? v.get<double>() < static_cast<double>(lo) : v.get<int64_t>() < lo))
      throw bad(key, v.dump() + " (expected an integer >= " + std::to_string(lo) + ")");
    return whole_float ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
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
  const json j = parse_json_unique(read_file(path), path);
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
    // A phase's mixture travels as "A:w,B:w" (train.data).
    if (file.get<std::string>().find(',') != std::string::npos)
      throw top.bad("sources." + name, file.dump() + " (expected a path without ',')");
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
    // A resume finds its phase by name: names are unique.
    for (const Phase& q : r.phases)
      if (q.name == p.name)
        throw rd.bad("name", "'" + p.name + "' names an earlier phase too (expected unique names)");
    p.tokens = rd.integer(pj, "tokens", 0, 1);
    if (p.tokens == 0) throw rd.bad("tokens", "missing (expected the phase's token budget)");
    p.seq = integer("seq", config.seq_len, 1);
    p.batch = integer("batch", 4, 1);
    p.accum = integer("accum", 1, 1);
    p.rope_theta = num("rope_theta", 0, 0, 1e12);
    if (p.rope_theta > 0 && p.rope_theta < 1)  // as the model config bounds it
      throw rd.bad("rope_theta", json(p.rope_theta).dump() +
                                     " (expected 0, the config's, or a number from 1 to 1e12)");
    if (p.seq > (int64_t{1} << 20))
      throw rd.bad("seq", std::to_string(p.seq) + " (expected at most 1048576, seq_len's ceiling)");
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
        if (!w.is_number() || !(w.get<double>() >= 0) || !(w.get<double>() <= 1e12))
          throw rd.bad("mixture." + name, w.dump() + " (expected a weight from 0 to 1e12)");
        if (w.get<double>() > 0) p.mixture[name] = w.get<double>();
      }
      if (p.mixture.empty()) throw rd.bad("mixture", "every weight is 0");
    }
    // Tokens per optimizer step over the replicas, and the plan, within
    // 2^50 (a run of a quadrillion tokens) so that nothing overflows.
    constexpr __int128 kMost = __int128{1} << 50;
    const __int128 wide = __int128{p.batch} * p.accum * p.seq * (world / p.cp);
    if (wide > kMost || p.tokens > kMost)
      throw rd.bad(wide > kMost ? "batch" : "tokens",
                   "batch x accum x seq x replicas and tokens must stay within 2^50 tokens");
    const auto per_step = static_cast<int64_t>(wide);
    p.steps = (p.tokens + per_step - 1) / per_step;
    if (step + p.steps > kMost) throw rd.bad("tokens", "the recipe's steps exceed 2^50");
    p.first_step = step;
    p.tokens_before = tokens;
    p.schedule.start = step;
    p.schedule.total = p.steps;
    if (p.schedule.warmup >= p.steps && !(p.steps == 1 && p.schedule.warmup <= 1))
      throw rd.bad("warmup", std::to_string(p.schedule.warmup) + " steps (the phase has " +
                                 std::to_string(p.steps) + ")");
    step += p.steps;
    p.trained_tokens = p.steps * per_step;
    tokens += p.trained_tokens;
    r.phases.push_back(p);
  }
  return r;
}

}  // namespace anvil::train
