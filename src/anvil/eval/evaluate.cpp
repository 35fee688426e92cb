#include "anvil/eval/evaluate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "anvil/base/error.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/progress.hpp"
#include "anvil/base/table.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/model_tensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/data/batches.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/data/tokens.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"

namespace anvil::eval {
using json = nlohmann::json;

namespace {

// One multiple-choice question, tokenized: context ids, and per choice its
// continuation ids and its length in characters (for acc_norm).
struct Question {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> choices;
  std::vector<double> chars;
  int gold = 0;
};

int64_t utf8_chars(const std::string& s) {
  int64_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// A model for rows of up to T tokens on `device`, with its weights.
std::unique_ptr<model::TrainableModel> load_model(const std::string& dir,
                                                  const model::ModelConfig& c, int64_t T,
                                                  device::DeviceKind device) {
  model::ModelOptions options;
  options.seq = T;
  options.training = false;
  options.device = device;
  auto m = model::model_family(c).make_model(c, options);
  ckpt::load_weights(dir, m->registry(), m->params(), m->extra_state());
  return m;
}

// Each task file's questions, tokenized through `text`; `longest` grows to
// the longest context + choice row (what sizes the model).
std::vector<std::vector<Question>> read_tasks(const EvalOptions& o, const data::TextCodec& text,
                                              const model::ModelConfig& config, int64_t& longest) {
  auto encode = [&](const std::string& s) { return text.encode(s, "--task"); };
  std::vector<std::vector<Question>> tasks;
  for (const auto& path : o.tasks) {
    std::ifstream f(path);
    if (!f) throw InputError("--task: " + path + ": no such file");
    std::vector<Question> qs;
    std::string line;
    for (int64_t no = 1; std::getline(f, line); ++no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (o.limit > 0 && static_cast<int64_t>(qs.size()) >= o.limit) break;
      const std::string where = path + ": line " + std::to_string(no);
      Question q;
      try {
        const json j = parse_json_unique(line, where);  // a duplicate key is an error
        std::string context = j.at("context").get<std::string>();
        const auto choices = j.at("choices").get<std::vector<std::string>>();
        if (choices.size() < 2)
          throw InputError(where + ": expected >= 2 choices");
        q.gold = static_cast<int>(json_integer(j.at("gold"), where + ": gold", 0,
                                               static_cast<int64_t>(choices.size()) - 1));
        for (const std::string& given : choices) {
          // lm-eval: a context's trailing whitespace moves to the continuation.
          std::string ctx = context, choice = given;
          while (!ctx.empty() && std::isspace(static_cast<unsigned char>(ctx.back()))) {
            choice.insert(choice.begin(), ctx.back());
            ctx.pop_back();
          }
          const auto whole = encode(ctx + choice);
          q.context = encode(ctx);
          if (q.context.empty() || whole.size() <= q.context.size())
            throw InputError(where + ": a context and every choice must each give a token");
          q.choices.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(q.context.size()),
                                 whole.end());
          // A context is cut on the left to fit; a choice must fit whole.
          if (static_cast<int64_t>(q.choices.back().size()) > config.seq_len)
            throw InputError(where + ": a choice of " + std::to_string(q.choices.back().size()) +
                             " tokens is longer than the model's context (" +
                             std::to_string(config.seq_len) + ")");
          q.chars.push_back(static_cast<double>(utf8_chars(given)));
          longest = std::max<int64_t>(longest, static_cast<int64_t>(whole.size()) - 1);
        }
      } catch (const json::exception& e) {
        throw InputError(where + ": " + e.what() +
                         " (expected {\"context\": str, \"choices\": [str, ...], \"gold\": int})");
      }
      for (const auto& ch : q.choices)
        for (const int32_t t : ch)
          if (t >= config.vocab_size)
            throw InputError(where + ": a token past the model's vocabulary");
      qs.push_back(std::move(q));
    }
    if (qs.empty()) throw InputError("--task: " + path + ": no questions");
    tasks.push_back(std::move(qs));
  }
  return tasks;
}

double stderr_of(double p, int64_t n) {  // of a mean of n Bernoulli outcomes (sample std)
  return n > 1 ? std::sqrt(p * (1 - p) / static_cast<double>(n - 1)) : std::nan("");  // n 1: none
}

}  // namespace

device::DeviceKind checkpoint_device(const std::string& name, const model::ModelConfig& config) {
  // A device that cannot run is refused before any work, as anvil train does.
  const device::DeviceKind device = device::parse_device(name, "--device");
  if (device == device::DeviceKind::cuda) {
    if (model::model_family(config).has_experts())
      throw InputError("--device: cuda runs the dense family (gpt2, llama configs); " +
                       config.name + " has no GPU path yet");
    const std::string why = device::cuda_unavailable_reason();
    if (!why.empty()) throw InputError("--device: cuda: no CUDA device can be used: " + why);
    device::select_gpu(0);
  }
  return device;
}

EvalResult evaluate(const EvalOptions& o) {
  if (o.data.empty() && o.tasks.empty())
    throw InputError("eval: expected --data NAME=FILE.tok and/or --task FILE.jsonl");
  EvalResult r;
  const std::string dir = ckpt::checkpoint_to_read(o.checkpoint, {}, ckpt::model_tensor_problems);
  r.checkpoint = dir;
  const auto state = ckpt::read_state(dir);
  const model::ModelConfig config =
      model::parse_model_config(state.at("config").dump(), dir + "/state.json");
  r.tokenizer = state.value("tokenizer", "random");
  const device::DeviceKind device = checkpoint_device(o.device, config);
  const int64_t T = o.seq > 0 ? o.seq : config.seq_len;
  if (T > config.seq_len || T < 2)
    throw InputError("--seq: expected 2.." + std::to_string(config.seq_len) +
                     " (the config's seq_len)");

  // Multiple-choice questions first: their longest row sizes the model.
  const data::TextCodec text(r.tokenizer, ckpt::tokenizer_model(dir), dir);
  int64_t longest = 2;
  const auto tasks = read_tasks(o, text, config, longest);
  const int64_t rows_T = o.data.empty() ? 0 : T;
  const int64_t model_T = std::max(rows_T, std::min(longest, config.seq_len));
  const auto model = load_model(dir, config, model_T, device);
  std::vector<int32_t> tokens(static_cast<size_t>(model_T)), targets(tokens.size());

  // Progress by forward pass: each perplexity row, each answer choice.
  size_t forwards = o.data.size() * static_cast<size_t>(o.rows), done = 0;
  for (const auto& task : tasks)
    for (const auto& q : task) forwards += q.choices.size();

  // Perplexity per source, over its held-out tail.
  for (const auto& [name, path] : o.data) {
    data::Batches b(path, config.vocab_size, 0, T, o.val_fraction);
    if (!b.has_validation()) throw InputError("--data: " + path + ": no held-out tail");
    // The run's own tokenizer, or the loss is of other ids (random-token
    // runs take any file).
    if (r.tokenizer != "random" && !data::same_tokenizer(b.tokenizer(), b.tokenizer_model(),
                                                         r.tokenizer, ckpt::tokenizer_model(dir))) {
      throw InputError(
          "--data: " + path + " is tokenized as " + b.tokenizer() +
          (b.tokenizer_model().empty() ? "" : " (" + b.tokenizer_model() + ")") +
          "; the run's tokenizer is " + r.tokenizer +
          " (expected a token file from anvil data tokenize with the run's tokenizer)");
    }
    SourceResult s{name, path};
    double nll = 0;
    for (int64_t i = 0; i < o.rows; ++i) {
      progress_line(true, done++, forwards, "perplexity " + name + " row " + std::to_string(i + 1));
      std::fill(targets.begin(), targets.end(), -1);
      std::fill(tokens.begin(), tokens.end(), 0);
      b.val_row(i, o.rows, tokens.data(), targets.data());
      int64_t scored = 0;
      nll += model->forward(tokens.data(), targets.data(), 1, model_T, &scored);
      s.tokens += scored;
    }
    s.loss = nll / static_cast<double>(s.tokens);
    s.perplexity = std::exp(s.loss);
    r.sources.push_back(s);
  }

  // Each choice: its tokens' log-likelihood after the context, in one
  // forward over context + choice (the last model_T tokens; padding after
  // the choice is not scored and, the model being causal, changes nothing).
  for (size_t t = 0; t < tasks.size(); ++t) {
    TaskResult tr{std::filesystem::path(o.tasks[t]).stem().string(), o.tasks[t]};
    int64_t right = 0, right_norm = 0;
    bool finite = true;  // a NaN log-likelihood would pick choice 0, "right" by chance
    for (const auto& q : tasks[t]) {
      double best = -INFINITY, best_norm = -INFINITY;
      int pick = 0, pick_norm = 0;
      for (size_t c = 0; c < q.choices.size(); ++c) {
        progress_line(true, done++, forwards, "task " + tr.name);
        std::vector<int32_t> row = q.context;
        row.insert(row.end(), q.choices[c].begin(), q.choices[c].end());
        const auto n = static_cast<int64_t>(row.size());
        const int64_t from = std::max<int64_t>(0, n - 1 - model_T);  // cut on the left
        std::fill(tokens.begin(), tokens.end(), 0);
        std::fill(targets.begin(), targets.end(), -1);
        const int64_t first_choice = static_cast<int64_t>(q.context.size());
        for (int64_t i = from; i + 1 < n; ++i) {
          tokens[i - from] = row[i];
          if (i + 1 >= first_choice) targets[i - from] = row[i + 1];
        }
        int64_t scored = 0;
        const double ll = -model->forward(tokens.data(), targets.data(), 1, model_T, &scored);
        finite = finite && std::isfinite(ll);
        const double norm = ll / std::max(1.0, q.chars[c]);
        if (ll > best) best = ll, pick = static_cast<int>(c);
        if (norm > best_norm) best_norm = norm, pick_norm = static_cast<int>(c);
      }
      right += pick == q.gold;
      right_norm += pick_norm == q.gold;
    }
    tr.questions = static_cast<int64_t>(tasks[t].size());
    tr.acc = static_cast<double>(right) / tr.questions;
    tr.acc_norm = static_cast<double>(right_norm) / tr.questions;
    tr.acc_stderr = stderr_of(tr.acc, tr.questions);
    tr.acc_norm_stderr = stderr_of(tr.acc_norm, tr.questions);
    if (!finite) {
      std::fprintf(stderr,
                   "anvil: warning: task %s: a log-likelihood is not finite (weights holding NaN "
                   "or inf?); its accuracy is left out\n",
                   tr.name.c_str());
      tr.acc = tr.acc_norm = tr.acc_stderr = tr.acc_norm_stderr = std::nan("");
    }
    r.tasks.push_back(tr);
  }
  progress_line(true, forwards, forwards, "");
  return r;
}

json EvalResult::to_json() const {
  json j = {{"checkpoint", checkpoint},
            {"tokenizer", tokenizer},
            {"perplexity", json::array()},
            {"tasks", json::array()}};
  for (const auto& s : sources)
    j["perplexity"].push_back({{"source", s.name},
                               {"path", s.path},
                               {"tokens", s.tokens},
                               {"loss", s.loss},
                               {"perplexity", s.perplexity}});
  for (const auto& t : tasks)
    j["tasks"].push_back({{"task", t.name},
                          {"path", t.path},
                          {"questions", t.questions},
                          {"acc", t.acc},
                          {"acc_stderr", t.acc_stderr},
                          {"acc_norm", t.acc_norm},
                          {"acc_norm_stderr", t.acc_norm_stderr}});
  return j;
}

std::string EvalResult::text() const {
  std::string out = "checkpoint " + checkpoint + " (tokenizer " + tokenizer + ")\n";
  if (!sources.empty()) {
    Table t({"source", "tokens", "loss", "perplexity"});
    for (const auto& s : sources)
      t.add_row({s.name, std::to_string(s.tokens), fmt(s.loss, 4), fmt(s.perplexity, 2)});
    out.append("\n").append(t.to_text());  // (append: GCC 12 warns falsely on "\n" + string)
  }
  if (!tasks.empty()) {
    Table t({"task", "questions", "acc", "+-", "acc_norm", "+-"});
    for (const auto& k : tasks)
      t.add_row({k.name, std::to_string(k.questions), fmt(k.acc, 4), fmt(k.acc_stderr, 4),
                 fmt(k.acc_norm, 4), fmt(k.acc_norm_stderr, 4)});
    out.append("\n").append(t.to_text());  // (append: GCC 12 warns falsely on "\n" + string)
  }
  return out;
}

}  // namespace anvil::eval
