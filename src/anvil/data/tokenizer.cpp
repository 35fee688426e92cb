#include "anvil/data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/progress.hpp"
#include "anvil/data/tokenizer_json.hpp"
#include "anvil/data/tokens.hpp"

namespace anvil::data {
namespace {

// The non-empty lines of the training files, one at a time, read as they
// are asked for (SentencePiece keeps only its sample of them).
class Lines : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const std::vector<std::string>& files) : files_(files) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }
  int64_t count() const { return count_.load(std::memory_order_relaxed); }  // any thread

 private:
  void advance() {
    for (;;) {
      if (!in_.is_open()) {
        if (next_ == files_.size()) {
          done_ = true;
          return;
        }
        in_.open(files_[next_], std::ios::binary);
        if (!in_) throw InputError("--text: " + files_[next_] + ": cannot open for reading");
        ++next_;
      }
      while (std::getline(in_, line_)) {
        if (!line_.empty()) {
          count_.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      }
      if (in_.bad()) throw SystemError("--text: " + files_[next_ - 1] + ": read failed");
      in_.close();
    }
  }
  std::vector<std::string> files_;
  size_t next_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
  std::atomic<int64_t> count_{0};  // read by the progress ticker
};

}  // namespace

TokenizerTrainResult train_tokenizer(const TokenizerTrainOptions& o) {
  if (o.texts.empty()) throw InputError("--text: expected at least one text file");
  for (const auto& t : o.texts)
    if (!std::filesystem::is_regular_file(t)) throw InputError("--text: " + t + ": no such file");
  if (o.type != "bpe" && o.type != "unigram")
    throw InputError("--type: " + o.type + " (expected bpe or unigram)");
  if (o.vocab_size < 260 || o.vocab_size > 1'000'000)
    throw InputError("--vocab: " + std::to_string(o.vocab_size) + " (expected 260..1000000)");
  if (o.out_prefix.empty()) throw InputError("--out: expected a path prefix");
  // The newline is a control symbol: only the line splitter inserts it, so
  // a literal "<nl>" in the text stays text. Specials are user-defined
  // symbols: text containing one encodes to its id (and decodes back).
  std::string symbols;
  for (const auto& s : o.special) {
    if (s.empty() || s.find(',') != std::string::npos || s == kNewlinePiece)
      throw InputError("--special: '" + s + "' (expected non-empty symbols without commas, "
                       "other than " + kNewlinePiece + ")");
    if (std::count(o.special.begin(), o.special.end(), s) > 1)
      throw InputError("--special: '" + s + "' given twice (expected each symbol once)");
    symbols += (symbols.empty() ? "" : ",") + s;
  }
  const auto t0 = now_seconds();
  Lines lines(o.texts);
  if (lines.done()) throw InputError("--text: no non-empty line to train on");
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", o.type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", o.byte_fallback ? "true" : "false"},
      {"control_symbols", kNewlinePiece},
      {"user_defined_symbols", symbols},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"unk_id", "0"},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"input_sentence_size", std::to_string(o.max_lines)},
      {"shuffle_input_sentence", "true"},
      {"minloglevel", "2"},
  };
  std::string model;
  // SentencePiece says nothing while it trains (its log is off: it would
  // flood a terminal) and a large text takes minutes: a line every
  // kProgressLogSeconds says it is still at work.
  std::mutex m;
  std::condition_variable cv;
  bool trained = false;
  std::thread ticker([&] {
    std::unique_lock<std::mutex> lock(m);
    for (int k = 1;; ++k) {
      if (cv.wait_for(lock, std::chrono::duration<double>(kProgressLogSeconds),
                      [&] { return trained; }))
        return;
      std::fprintf(stderr, "tokenizer train: %s, %.0f s (%lld lines read so far)\n", o.type.c_str(),
                   k * kProgressLogSeconds, static_cast<long long>(lines.count()));
    }
  });
  const auto status = [&] {
    struct Stop {
      std::mutex& m;
      std::condition_variable& cv;
      bool& trained;
      std::thread& ticker;
      ~Stop() {
        {
          const std::lock_guard<std::mutex> lock(m);
          trained = true;
        }
        cv.notify_all();
        ticker.join();
      }
    } stop{m, cv, trained, ticker};
    return sentencepiece::SentencePieceTrainer::Train(spec, &lines, &model);
  }();
  if (!status.ok()) {
    // SentencePiece's reasons name its own flags; the one a user meets is
    // the vocabulary below the text's distinct characters.
    const std::string why(status.message());
    const auto at = why.find("required_chars. ");
    if (at != std::string::npos) {
      const std::string sizes = why.substr(at + 16, why.find('.', at + 16) - at - 16);
      throw InputError("--vocab: " + std::to_string(o.vocab_size) +
                       " is below the pieces the text's distinct characters need (" + sizes +
                       "); expected a larger --vocab");
    }
    throw InputError("tokenizer train: " + why.substr(0, why.find('\n')));
  }
  TokenizerTrainResult r;
  r.model_path = o.out_prefix + ".model";
  r.vocab_path = o.out_prefix + ".vocab";
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(model).ok())
    throw SystemError("tokenizer train: SentencePiece returned a model it cannot load");
  std::string vocab;
  for (int i = 0; i < sp.GetPieceSize(); ++i) {
    char score[32];
    std::snprintf(score, sizeof score, "\t%g\n", static_cast<double>(sp.GetScore(i)));
    vocab += sp.IdToPiece(i) + score;
  }
  write_file_atomic(r.model_path, model);
  write_file_atomic(r.vocab_path, vocab);
  r.vocab_size = sp.GetPieceSize();
  r.lines = o.max_lines > 0 ? std::min<int64_t>(lines.count(), o.max_lines) : lines.count();
  r.seconds = now_seconds() - t0;
  return r;
}

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::filesystem::is_regular_file(model_path))
    throw InputError("--tokenizer: " + model_path + ": no such file");
  const std::string proto = read_file(model_path);
  if (const auto problem = sentencepiece_piece_problem(proto); !problem.empty())
    throw InputError("--tokenizer: " + model_path + ": not a usable SentencePiece model (" +
                     problem + ")");
  sentencepiece::util::Status status;
  try {
    status = sp_->LoadFromSerializedProto(proto);
  } catch (const std::exception& e) {
    status = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, e.what());
  }
  if (!status.ok())
    throw InputError("--tokenizer: " + model_path + ": not a SentencePiece model (" +
                     status.ToString() + ")");
  const int nl = sp_->PieceToId(kNewlinePiece);
  newline_ = nl != sp_->unk_id() ? nl : -1;
  // SentencePiece writes a space as U+2581 (E2 96 81); a literal one in the
  // text would decode as a space. With byte pieces it goes out as its three
  // bytes, which decode as the character.
  for (int b = 0; b < 3; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", static_cast<unsigned char>(kSpaceMark[b]));
    space_mark_[b] = sp_->PieceToId(piece);
    if (space_mark_[b] == sp_->unk_id()) space_mark_[0] = -1;
  }
}

Tokenizer::~Tokenizer() = default;

int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string Tokenizer::piece(int32_t id) const { return sp_->IdToPiece(id); }

void Tokenizer::encode_lines(std::string_view text, std::vector<int32_t>& out,
                             std::atomic<size_t>* done) const {
  std::vector<int> ids;
  size_t at = 0;
  while (true) {
    const size_t nl = newline_ >= 0 ? text.find('\n', at) : std::string_view::npos;
    const std::string_view line = text.substr(at, nl == std::string_view::npos ? nl : nl - at);
    size_t from = 0;
    while (from < line.size()) {
      const size_t mark = space_mark_[0] >= 0 ? line.find(kSpaceMark, from) : std::string_view::npos;
      const std::string_view run =
          line.substr(from, mark == std::string_view::npos ? mark : mark - from);
      if (!run.empty()) {
        ids.clear();
        const auto status = sp_->Encode(run, &ids);
        if (!status.ok()) throw InputError(path_ + ": cannot encode: " + status.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
      }
      if (mark == std::string_view::npos) break;
      out.insert(out.end(), space_mark_, space_mark_ + 3);
      from = mark + 3;
    }
    if (done != nullptr) done->fetch_add(line.size() + 1, std::memory_order_relaxed);
    if (nl == std::string_view::npos) return;
    out.push_back(newline_);
    at = nl + 1;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, int threads, bool progress) const {
  threads = std::max(1, std::min<int>(threads, static_cast<int>(text.size() / 65536) + 1));
  // Cut at newlines into `threads` pieces of about equal size; each piece's
  // trailing newline stays with it, so the concatenation is the serial result.
  std::vector<std::string_view> parts;
  size_t at = 0;
  for (int t = 0; t < threads && at < text.size(); ++t) {
    size_t end = t + 1 == threads ? text.size() : at + (text.size() - at) / (threads - t);
    if (end < text.size()) {
      const size_t nl = text.find('\n', end);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    parts.push_back(text.substr(at, end - at));
    at = end;
  }
  if (parts.size() <= 1) {
    std::vector<int32_t> out;
    encode_lines(text, out);
    return out;
  }
  std::vector<std::vector<int32_t>> outs(parts.size());
  std::vector<std::exception_ptr> errors(parts.size());
  std::vector<std::thread> pool;
  std::atomic<size_t> done{0}, finished{0};
  for (size_t p = 0; p < parts.size(); ++p) {
    pool.emplace_back([&, p] {
      try {
        // A piece ending in '\n' encodes it; the next piece starts a line.
        encode_lines(parts[p], outs[p], &done);
      } catch (...) {
        errors[p] = std::current_exception();
      }
      finished.fetch_add(1);
    });
  }
  // Progress by MiB encoded, from 16 MiB on (a corpus of gigabytes takes
  // minutes; a small text is done before a line could help).
  const size_t total_mib = text.size() >> 20;
  if (progress && total_mib >= 16) {
    while (finished.load() < parts.size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      progress_line(true, std::min(done.load() >> 20, total_mib - 1), total_mib, "MiB encoded");
    }
    progress_line(true, total_mib, total_mib, "");
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<int32_t> out;
  for (const auto& o : outs) out.insert(out.end(), o.begin(), o.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text, piece;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    piece.clear();
    const auto status = sp_->Decode(run, &piece);
    if (!status.ok()) throw InputError(path_ + ": cannot decode: " + status.ToString());
    text += piece;
    run.clear();
  };
  for (const int32_t id : ids) {
    if (id < 0 || id >= sp_->GetPieceSize())
      throw InputError(path_ + ": token id " + std::to_string(id) + " outside the vocabulary of " +
                       std::to_string(sp_->GetPieceSize()));
    if (id == newline_) {
      flush();
      text += '\n';
    } else {
      run.push_back(id);
    }
  }
  flush();
  return text;
}

TextCodec::TextCodec(const std::string& kind, const std::string& model_path,
                     const std::string& where)
    : kind_(kind) {
  if (kind != "sentencepiece") return;
  if (model_path.empty())
    throw InputError(where + ": trained with a SentencePiece tokenizer, but its run directory has "
                     "no tokenizer.model");
  sp_ = std::make_unique<Tokenizer>(model_path);
}

size_t first_invalid_utf8(std::string_view text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::vector<int32_t> TextCodec::encode(const std::string& text, const std::string& flag) const {
  if (sp_) {
    if (const size_t at = first_invalid_utf8(text); at != std::string_view::npos)
      throw InputError(flag + ": not UTF-8 at byte " + std::to_string(at) +
                       " (the run's SentencePiece tokenizer reads UTF-8 text)");
    return sp_->encode(text);
  }
  if (kind_ == "bytes") return encode_bytes(text);
  throw InputError(flag + ": the checkpoint's tokenizer is '" + kind_ +
                   "', not text (a bytes or SentencePiece run); give token ids instead");
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const {
  return sp_ ? sp_->decode(ids) : decode_bytes(ids);
}

}  // namespace anvil::data
