#include "anvil/train/options.hpp"

#include <filesystem>

#include "anvil/base/dtype.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/files.hpp"
#include "anvil/data/batches.hpp"

namespace anvil::train {
namespace {

using json = nlohmann::json;

std::string absolute(const std::string& path) {
  return path.empty() ? path : std::filesystem::absolute(path).lexically_normal().string();
}

}  // namespace

void TrainOptions::finish() {
  walk([](const OptionInfo& info, auto& value, const auto& check) {
    check_option(info, value, check);
  });
  model.dtype = to_string(parse_dtype(model.dtype, "model.dtype", {Dtype::fp32, Dtype::bf16}));
  if (optimizer.schedule.total == 0) optimizer.schedule.total = train.steps;
  if (checkpoint.resume == "latest" && checkpoint.out.empty())
    throw InputError("checkpoint.resume: 'latest' needs checkpoint.out (the run directory)");
  if (checkpoint.resume_new_accum && checkpoint.resume.empty())
    throw InputError("checkpoint.resume_new_accum: needs checkpoint.resume");
  if (optimizer.muon.ns_bf16 && optimizer.name != "muon")
    throw InputError("optimizer.muon_bf16: needs optimizer.name muon, got " + optimizer.name);
  if (!faults.inject.empty()) ft::parse_fault(faults.inject, "faults.inject");
}

json TrainOptions::to_json() const {
  json j = json::object();
  TrainOptions copy = *this;
  copy.walk(
      [&j](const OptionInfo& info, auto& value, const auto&) { option_to_json(info, value, j); });
  return j;
}

void TrainOptions::update_from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) throw InputError(origin + ": expected a JSON object of option sections");
  std::vector<std::string> known;
  walk([&](const OptionInfo& info, auto& value, const auto&) {
    known.push_back(info.key());
    option_from_json(info, value, j, origin);
  });
  const auto unknown = unknown_option_keys(j, known);
  if (!unknown.empty())
    throw InputError(origin + ": unknown option '" + unknown.front() +
                     "' (expected section.name keys as in a run's train.json)");
}

TrainOptions repeatable(const TrainOptions& o) {
  TrainOptions r = o;
  r.model.config = absolute(o.model.config);
  std::string data;
  if (!o.train.data.empty()) {
    for (const auto& s : data::parse_sources(o.train.data, "train.data")) {
      if (!data.empty()) data.append(",");
      data.append(absolute(s.path));
      if (s.weight != 1) data.append(":").append(json(s.weight).dump());
    }
  }
  r.train.data = data;
  r.checkpoint.out = absolute(o.checkpoint.out);
  // A schedule that spans the run's steps is written as such (0), so that a
  // repeat with another --steps stretches it as a fresh run would.
  if (r.optimizer.schedule.total == r.train.steps) r.optimizer.schedule.total = 0;
  r.checkpoint.resume.clear();
  r.checkpoint.resume_new_accum = false;
  r.checkpoint.resume_new_phase = false;
  r.metrics.tensorboard = absolute(o.metrics.tensorboard);
  r.metrics.hw_profile = absolute(o.metrics.hw_profile);
  r.metrics.json_out = absolute(o.metrics.json_out);
  r.guard.heartbeat = absolute(o.guard.heartbeat);
  r.faults.inject.clear();
  return r;
}

TrainOptions load_train_options(const std::string& file) {
  const json j = parse_json_unique(read_file(file), file);
  TrainOptions o;
  o.update_from_json(j, file);
  // A recipe's phases each write RUN/train.json over the last: the file holds
  // one phase, and trained alone it would start that phase from step 0.
  if (!o.phase.name.empty())
    throw InputError(file + ": written by phase '" + o.phase.name +
                     "' of a recipe run; expected a plain run's train.json (repeat the recipe "
                     "with --recipe, or remove its phase section to train this phase alone)");
  return o;
}

}  // namespace anvil::train
