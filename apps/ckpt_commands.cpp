// `anvil ckpt export | import | verify | diff | reshape`: checkpoints to and
// from Hugging Face directories, their integrity, comparison and layout.
// Every command names a checkpoint with --checkpoint (a step directory or a
// run directory, meaning its newest step).
#include "anvil/base/threads.hpp"
#include "anvil/ckpt/hf.hpp"
#include "anvil/ckpt/inspect.hpp"
#include "cli.hpp"

namespace anvil::cli {
namespace {

class CkptCommands : public CommandFamily {
 public:
  void add_to(CLI::App& app, Context&) override {
    auto* ckpt = app.add_subcommand("ckpt", "Checkpoints: export, import, verify, diff, reshape");
    ckpt->require_subcommand(1);
    add_export(ckpt);
    add_import(ckpt);
    verify_ = ckpt->add_subcommand(
        "verify",
        "Check a checkpoint (or every checkpoint of a run): each shard against its CRC-32, every "
        "tensor covered once, state.json; exit 0 when all are intact, 2 when one is not");
    verify_->add_option("dir,--checkpoint", verify_path_, "A step-* directory or a run directory")
        ->required();
    verify_->add_flag("--json", verify_json_, "Print JSON instead of the table");
    diff_ = ckpt->add_subcommand(
        "diff",
        "Compare two checkpoints tensor by tensor (weights and optimizer state, any layouts): "
        "exit 0 when every tensor in both has the same bytes and no weights are missing, 1 when "
        "one differs; optimizer state on one side only is named, not counted");
    diff_->add_option("a,--checkpoint", diff_a_, "A step-* directory or a run directory")
        ->required();
    diff_->add_option("b,--against", diff_b_, "The checkpoint to compare it with")->required();
    diff_->add_flag("--json", diff_json_,
                    "Print JSON instead: every differing tensor with its largest difference");
    reshape_ = ckpt->add_subcommand(
        "reshape",
        "Rewrite a checkpoint as written by N ranks (any layout in; the same tensors out). "
        "anvil train --resume also reshapes on load: any rank count, --zero or not, any --ep");
    reshape_->add_option("--checkpoint", reshape_from_, "A step-* directory or a run directory")
        ->required();
    reshape_->add_option("--to", reshape_to_, "Ranks of the new layout (files rank-00000..N-1)")
        ->required()
        ->check(in_range(1, 65536));
    reshape_->add_option("--out", reshape_out_, "Run directory to write step-N into")
        ->required()
        ->check(output_dir());
  }

  std::optional<int> run(Context&) override {
    if (*export_) {
      const auto r = ckpt::export_checkpoint(export_options_);
      std::cerr << "wrote " << r.out_dir << ": " << r.architecture << ", " << r.tensors
                << " tensors, " << r.parameters << " parameters, " << export_options_.dtype << ", "
                << r.files << " safetensors file(s) + config.json\n";
      return 0;
    }
    if (*import_) {
      const auto r = ckpt::import_hf(import_hf_, import_out_);
      std::cerr << "wrote " << r.checkpoint_dir << ": " << r.architecture << ", " << r.tensors
                << " tensors, " << r.parameters << " parameters; model config " << r.config_path
                << (r.note.empty() ? "" : "; " + r.note) << "\n";
      return 0;
    }
    if (*verify_) {
      const auto reports = ckpt::verify_path(verify_path_);
      std::cout << (verify_json_ ? ckpt::verify_json(reports).dump(2) + "\n"
                                 : ckpt::verify_table(reports).to_text());
      for (const auto& r : reports)
        if (!r.problems.empty()) throw InputError(r.dir + " is damaged: " + r.problems.front());
      return 0;
    }
    if (*diff_) {
      const auto d = ckpt::diff_checkpoints(diff_a_, diff_b_);
      std::cout << (diff_json_ ? d.to_json().dump(2) + "\n" : d.text());
      return d.same() ? 0 : kExitDifference;
    }
    if (*reshape_) {
      const std::string dir = ckpt::reshape_checkpoint(reshape_from_, reshape_out_, reshape_to_);
      std::cerr << "wrote " << dir << " as " << reshape_to_ << " rank file(s)\n";
      return 0;
    }
    return std::nullopt;
  }

 private:
  void add_export(CLI::App* ckpt) {
    export_ = ckpt->add_subcommand(
        "export",
        "Write a checkpoint as a Hugging Face directory that transformers' "
        "AutoModelForCausalLM.from_pretrained loads (ZAYA1 -> ZayaForCausalLM, GPT-2 shaped -> "
        "GPT2LMHeadModel, Llama shaped -> LlamaForCausalLM; docs/interop.md)");
    ckpt::ExportOptions& x = export_options_;
    export_->add_option("--checkpoint", x.checkpoint, "A step-* directory or a run directory")
        ->required();
    export_->add_option("--out", x.out_dir, "New directory to write")
        ->required()
        ->check(output_dir());
    auto* format = export_
        ->add_option("--format", x.format,
                     "hf: transformers' native layout; original: ZAYA1's alternating layer "
                     "layout (Zyphra's names, what transformers' converter takes)")
        ->check(one_of({"hf", "original"}))
        ->capture_default_str();
    add_dtype_option(export_, "--dtype", x.dtype, {Dtype::fp32, Dtype::bf16},
                     "Tensor type: fp32 is exact, bf16 rounds to nearest even",
                     [](Dtype d) { return d == Dtype::bf16 ? "bfloat16" : "float32"; });
    export_
        ->add_option("--max-shard-size", x.max_shard_bytes,
                     "Largest safetensors file (e.g. 5GB, 500MB); above it the weights are split "
                     "into model-0000k-of-0000n.safetensors with model.safetensors.index.json")
        ->transform(CLI::AsSizeValue(true))
        ->default_str("5GB");
    export_->add_flag_callback("--hf", [&x] { x.format = "hf"; }, "The same as --format hf")
        ->excludes(format);
  }

  void add_import(CLI::App* ckpt) {
    import_ = ckpt->add_subcommand(
        "import",
        "Turn a transformers checkpoint directory (ZayaForCausalLM, GPT2LMHeadModel, "
        "LlamaForCausalLM) into an anvil run directory: a weights-only checkpoint at step 0 "
        "and model-config.json, for anvil generate and anvil train --config "
        "RUN/model-config.json --resume RUN");
    import_
        ->add_option("--hf", import_hf_,
                     "Directory with config.json and model.safetensors (or a sharded index)")
        ->required()
        ->check(CLI::ExistingDirectory);
    import_->add_option("--out", import_out_, "New (or empty) run directory to write")
        ->required()
        ->check(output_dir());
  }

  CLI::App *export_ = nullptr, *import_ = nullptr, *verify_ = nullptr, *diff_ = nullptr,
           *reshape_ = nullptr;
  ckpt::ExportOptions export_options_;
  std::string import_hf_, import_out_, verify_path_, diff_a_, diff_b_, reshape_from_, reshape_out_;
  bool verify_json_ = false, diff_json_ = false;
  int reshape_to_ = 1;
};

}  // namespace

std::unique_ptr<CommandFamily> make_ckpt_commands() {
  return std::make_unique<CkptCommands>();
}

}  // namespace anvil::cli
