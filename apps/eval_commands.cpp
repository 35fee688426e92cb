// `anvil eval`, `anvil generate` and `anvil plot`: what a trained checkpoint
// scores and says, and charts of a run or a benchmark. The validation flags
// (--val-batches, --val-fraction, -T/--seq) mean what they mean in train.
#include <filesystem>
#include <set>

#include "anvil/base/threads.hpp"
#include "anvil/eval/evaluate.hpp"
#include "anvil/eval/generate.hpp"
#include "anvil/eval/plot.hpp"
#include "cli.hpp"

namespace anvil::cli {
namespace {

void add_threads(CLI::App* cmd, int& threads) {
  cmd->add_option("--threads", threads, "Compute threads (0: OMP_NUM_THREADS or every core)")
      ->check(at_least(0))
      ->capture_default_str();
}

class EvalCommands : public CommandFamily {
 public:
  void add_to(CLI::App& app, Context&) override {
    add_eval(app);
    add_generate(app);
    plot_ = app.add_subcommand(
        "plot",
        "PNG charts (gnuplot) of a run (loss and validation loss by phase, lr, tokens/s and "
        "MFU, ZAYA1 router load and skip rate) or of bench JSON (comm: bus bandwidth by message "
        "size per algorithm; gemm: GFLOP/s by size)");
    auto* run = plot_->add_option("--run", plot_run_, "A run directory (anvil train --out)");
    plot_->add_option("--bench", plot_bench_, "anvil bench comm|gemm --json output")
        ->excludes(run)
        ->check(CLI::ExistingFile);
    plot_
        ->add_option(
            "--out", plot_out_,
            "Directory for the PNGs (default: RUN/plots, or a plots/ folder beside the JSON)")
        ->check(output_dir());
  }

  std::optional<int> run(Context&) override {
    if (*eval_) return evaluate();
    if (*generate_) return generate();
    if (*plot_) return plot();
    return std::nullopt;
  }

 private:
  void add_eval(CLI::App& app) {
    eval_ = app.add_subcommand(
        "eval",
        "Evaluate a checkpoint: perplexity per source on the held-out tail of token files, and "
        "multiple-choice tasks from JSONL (acc and acc_norm as lm-eval reports them; "
        "docs/eval.md)");
    eval::EvalOptions& e = eval_options_;
    eval_->add_option("--checkpoint", e.checkpoint, "A step-* directory or a run directory")
        ->required();
    eval_->add_option("--data", eval_data_,
                      "NAME=FILE (or FILE): a token file or raw text; perplexity on its held-out "
                      "tail (repeatable)");
    eval_
        ->add_option("--task", e.tasks,
                     "JSONL, one {\"context\", \"choices\", \"gold\"} per line (repeatable)")
        ->check(CLI::ExistingFile);
    eval_->add_option("--val-batches,--rows", e.rows, "Perplexity sequences per source")
        ->check(at_least(1))
        ->capture_default_str();
    eval_->add_option("--seq,-T", e.seq, "Tokens per perplexity sequence (0: the config's seq_len)")
        ->check(at_least(0))
        ->capture_default_str();
    eval_
        ->add_option("--val-fraction", e.val_fraction,
                     "The held-out tail of each token file (as anvil train's)")
        ->check(in_range(0.0, 0.5))
        ->capture_default_str();
    eval_->add_option("--limit", e.limit, "Questions per task (0: all)")
        ->check(at_least(0))
        ->capture_default_str();
    eval_
        ->add_option("--device", e.device,
                     "Where the model runs: cpu, or cuda (the dense family, fp32; GPU 0)")
        ->check(one_of({"cpu", "cuda"}))
        ->capture_default_str();
    eval_output_.add_to(eval_, /*with_csv=*/false);
    add_threads(eval_, threads_);
  }

  void add_generate(CLI::App& app) {
    generate_ = app.add_subcommand("generate", "Sample text from a checkpoint (KV cache)");
    eval::GenerateOptions& g = generate_options_;
    generate_
        ->add_option("--checkpoint", g.checkpoint, "Checkpoint dir or run dir (its newest step)")
        ->required();
    auto* text = generate_->add_option("--prompt", g.prompt, "Prompt text (the run's tokenizer)");
    generate_->add_option("--prompt-tokens", g.prompt_tokens, "Prompt as token ids")
        ->delimiter(',')
        ->excludes(text);
    generate_->add_option("--max-new", g.max_new, "Tokens to generate")
        ->check(at_least(1))
        ->capture_default_str();
    generate_->add_option("--temperature", g.temperature, "Sampling temperature (0: greedy)")
        ->check(at_least(0))
        ->capture_default_str();
    generate_->add_option("--top-k", g.top_k, "Sample among the k most likely (0: all)")
        ->check(at_least(0))
        ->capture_default_str();
    generate_->add_option("--seed", g.seed, "Sampling seed")
        ->check(number_text(Number::unsigned_whole))
        ->capture_default_str();
    generate_
        ->add_option("--device", g.device,
                     "Where the model runs: cpu, or cuda (the dense family, fp32, its KV cache "
                     "in GPU memory; GPU 0)")
        ->check(one_of({"cpu", "cuda"}))
        ->capture_default_str();
    add_threads(generate_, threads_);
  }

  int evaluate() {
    if (threads_ > 0) set_num_threads(threads_);
    std::set<std::string> names;
    for (const auto& d : eval_data_) {
      const auto eq = d.find('=');
      const std::string name =
          eq == std::string::npos ? std::filesystem::path(d).stem().string() : d.substr(0, eq);
      const std::string path = eq == std::string::npos ? d : d.substr(eq + 1);
      if (name.empty() || path.empty())
        throw InputError("--data: '" + d + "' (expected PATH or NAME=PATH with both parts)");
      if (!names.insert(name).second)
        throw InputError("--data: the name '" + name +
                         "' twice (expected one per source; NAME=PATH names one)");
      eval_options_.data.emplace_back(name, path);
    }
    const auto r = eval::evaluate(eval_options_);
    const auto j = r.to_json();
    if (!eval_output_.out.empty()) write_file_atomic(eval_output_.out, j.dump(2) + "\n");
    std::cout << (eval_output_.json ? j.dump(2) + "\n" : r.text());
    return 0;
  }

  int generate() {
    if (threads_ > 0) set_num_threads(threads_);
    eval::GenerateOptions& g = generate_options_;
    if (g.prompt.empty() && g.prompt_tokens.empty())
      throw InputError("generate: expected --prompt TEXT or --prompt-tokens IDS");
    // Text in, text out; token ids in, ids out. The prompt is echoed with
    // the first new token, once the checkpoint has loaded.
    const bool ids = !g.prompt_tokens.empty();
    bool echoed = ids;
    const auto echo = [&] {
      if (!echoed) std::cout << g.prompt;
      echoed = true;
    };
    const auto r = eval::generate(g, [&](int32_t t, const std::string& text) {
      echo();
      if (ids && t < 0) return;  // a text tail, for text output only
      std::cout << (ids ? std::to_string(t) + " " : text) << std::flush;
    });
    echo();
    std::cout << "\n";
    std::cerr << r.tokens.size() << " tokens at " << static_cast<int>(r.tokens_per_second)
              << " tokens/s" << (r.capped ? " (stopped at the model's context length)" : "")
              << "\n";
    return 0;
  }

  int plot() {
    if (plot_run_.empty() == plot_bench_.empty())
      throw InputError("plot: expected --run RUN or --bench FILE.json");
    const auto files =
        plot_run_.empty()
            ? eval::plot_bench(
                  plot_bench_,
                  plot_out_.empty()
                      ? (std::filesystem::path(plot_bench_).parent_path() / "plots").string()
                      : plot_out_)
            : eval::plot_run(plot_run_, plot_out_.empty() ? plot_run_ + "/plots" : plot_out_);
    for (const auto& f : files) std::cout << f << "\n";
    return 0;
  }

  CLI::App *eval_ = nullptr, *generate_ = nullptr, *plot_ = nullptr;
  eval::EvalOptions eval_options_;
  std::vector<std::string> eval_data_;
  OutputFlags eval_output_;
  eval::GenerateOptions generate_options_;
  int threads_ = 0;
  std::string plot_run_, plot_bench_, plot_out_;
};

}  // namespace

std::unique_ptr<CommandFamily> make_eval_commands() {
  return std::make_unique<EvalCommands>();
}

}  // namespace anvil::cli
