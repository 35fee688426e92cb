// `anvil data tokenize` and `anvil data tokenizer train`: text to token
// files, and SentencePiece tokenizers trained on text.
#include "anvil/data/tokenize.hpp"
#include "anvil/data/tokenizer.hpp"
#include "cli.hpp"

namespace anvil::cli {
namespace {

class DataCommands : public CommandFamily {
 public:
  void add_to(CLI::App& app, Context&) override {
    auto* data = app.add_subcommand("data", "Training data: tokenize, tokenizer");
    data->require_subcommand(1);
    tokenize_ = data->add_subcommand(
        "tokenize",
        "Text -> token file (with --tokenizer: SentencePiece, else one token per byte)");
    data::TokenizeOptions& t = tokenize_options_;
    tokenize_->add_option("--text", t.texts, "UTF-8 text file(s), concatenated in order")
        ->required()
        ->check(CLI::ExistingFile);
    tokenize_->add_option("--out", t.out, "Token file to write (format: docs/data.md)")
        ->required()
        ->check(output_file());
    tokenize_->add_option("--tokenizer", t.tokenizer,
                          "SentencePiece model (anvil data tokenizer train); the token file gets "
                          "a sidecar OUT.json naming it, so runs trained on it decode with it");
    tokenize_->add_option("--threads", t.threads, "Encoding threads")
        ->check(at_least(1))
        ->capture_default_str();
    tokenize_->add_flag("--verify", t.verify,
                        "Decode the tokens again and compare with the text byte for byte (exit 1 "
                        "and the first differing offset when they differ; nothing written)");
    auto* tokenizer = data->add_subcommand("tokenizer", "SentencePiece tokenizers: train");
    tokenizer->require_subcommand(1);
    add_tokenizer_train(tokenizer);
  }

  std::optional<int> run(Context&) override {
    if (*tokenize_) return tokenize();
    if (*train_) {
      const auto r = data::train_tokenizer(train_options_);
      std::cerr << "wrote " << r.model_path << " and " << r.vocab_path << ": "
                << train_options_.type << ", vocabulary " << r.vocab_size << ", trained on "
                << r.lines << " lines in " << r.seconds << " s\n";
      return 0;
    }
    return std::nullopt;
  }

 private:
  void add_tokenizer_train(CLI::App* tokenizer) {
    train_ = tokenizer->add_subcommand(
        "train",
        "Train a SentencePiece tokenizer (Debian's libsentencepiece): PREFIX.model and "
        "PREFIX.vocab; newlines are a piece of their own, spaces are kept, unknown characters "
        "fall back to bytes, so text round-trips byte for byte");
    data::TokenizerTrainOptions& o = train_options_;
    train_->add_option("--text", o.texts, "UTF-8 text file(s) to train on")
        ->required()
        ->check(CLI::ExistingFile);
    train_->add_option("--out", o.out_prefix, "Output prefix: PREFIX.model, PREFIX.vocab")
        ->required()
        ->check(output_file());
    train_->add_option("--vocab", o.vocab_size, "Vocabulary size (260..1000000)")
        ->capture_default_str();
    train_
        ->add_option("--type", o.type,
                     "bpe or unigram (unigram needs about 25x the sampled text in memory; "
                     "--max-lines bounds it)")
        ->check(one_of({"bpe", "unigram"}))
        ->capture_default_str();
    train_->add_flag("--byte-fallback,!--no-byte-fallback", o.byte_fallback,
                     "Characters outside the vocabulary as <0xNN> byte pieces (default on; off: "
                     "they become <unk> and the round trip is lossy)");
    train_->add_option("--special", o.special,
                       "Special tokens, each one id (e.g. --special '<|endoftext|>' '<pad>')");
    train_->add_option("--threads", o.threads, "Training threads")
        ->check(at_least(1))
        ->capture_default_str();
    train_->add_option("--max-lines", o.max_lines, "Lines sampled for training (0: all)")
        ->check(at_least(0))
        ->capture_default_str();
  }

  int tokenize() {
    const data::TokenizeOptions& t = tokenize_options_;
    const auto r = data::tokenize_files(t);
    if (r.differs) {
      std::cerr << "anvil: round trip differs at byte " << r.first_difference << " of " << r.bytes
                << " (decoded " << r.decoded_bytes << " bytes); nothing written\n";
      return kExitDifference;
    }
    if (r.verified) std::cerr << "round trip: " << r.bytes << " bytes decoded back exactly\n";
    if (t.tokenizer.empty()) {
      std::cerr << "wrote " << t.out << ": " << r.tokens << " tokens (bytes, vocabulary 256)\n";
      return 0;
    }
    std::cerr << "wrote " << t.out << " (+ .json): " << r.tokens << " tokens, vocabulary "
              << r.vocab << ", "
              << (r.tokens == 0 ? 0.0
                                : static_cast<double>(r.bytes) / static_cast<double>(r.tokens))
              << " bytes per token; encoded " << static_cast<double>(r.bytes) / 1e6 << " MB in "
              << r.seconds << " s on " << t.threads << " thread(s)\n";
    return 0;
  }

  CLI::App *tokenize_ = nullptr, *train_ = nullptr;
  data::TokenizeOptions tokenize_options_;
  data::TokenizerTrainOptions train_options_;
};

}  // namespace

std::unique_ptr<CommandFamily> make_data_commands() {
  return std::make_unique<DataCommands>();
}

}  // namespace anvil::cli
