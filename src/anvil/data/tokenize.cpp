#include "anvil/data/tokenize.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/progress.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/data/tokens.hpp"

namespace anvil::data {

// The text is read in blocks (o.block_bytes): memory stays a few blocks
// whatever the corpus, the tokens going to the file as they come.
TokenizeResult tokenize_files(const TokenizeOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  uint64_t total = 0;
  for (const auto& f : o.texts) {  // the output would replace its own input
    if (fs::exists(o.out, ec) && fs::equivalent(f, o.out, ec))
      throw InputError("--out: " + o.out + " is the input text " + f +
                       "; expected another path for the token file");
    if (fs::exists(o.out + ".json", ec) && fs::equivalent(f, o.out + ".json", ec))
      throw InputError("--out: " + o.out + ".json (its sidecar) is the input text " + f);
    if (fs::is_directory(f, ec)) throw InputError(f + ": is a directory, expected a file");
    const auto size = fs::file_size(f, ec);
    if (!ec) total += size;
  }
  std::optional<Tokenizer> tk;
  if (!o.tokenizer.empty()) tk.emplace(o.tokenizer);
  TokenizeResult r;
  r.vocab = tk ? tk->vocab_size() : 256;
  // Made at the first tokens: an input refused at its first block leaves
  // no folder or temporary behind.
  std::optional<TokenFileWriter> out;
  const size_t total_mib = static_cast<size_t>(total >> 20);
  const bool show = total_mib >= 16;
  struct EndProgress {  // the progress line ended on every way out, errors too
    bool show;
    size_t total;
    ~EndProgress() { progress_line(show, total, total, ""); }
  } end_progress{show, total_mib};
  // SentencePiece encodes whole lines: the text goes to the encoder in
  // pieces cut after a newline (the ids are those of the whole text), and a
  // file's last line without one joins the next file's first, as the
  // concatenation would. `verify` decodes each piece back against it.
  std::string piece;
  double encoding = 0;
  const auto encode = [&](std::string_view text) {
    if (text.empty()) return true;
    if (!out) out.emplace(o.out, r.vocab);
    if (!tk) {
      out->append_bytes(text);
      r.bytes += static_cast<int64_t>(text.size());
      return true;
    }
    const double t0 = now_seconds();
    const auto ids = tk->encode(text, o.threads, /*progress=*/false);
    encoding += now_seconds() - t0;
    if (o.verify) {
      const std::string back = tk->decode(ids);
      if (back != text) {
        size_t at = 0;
        while (at < back.size() && at < text.size() && back[at] == text[at]) ++at;
        r.differs = true;
        r.first_difference = r.bytes + static_cast<int64_t>(at);
        // Decoded through the piece that differs; of the whole text's bytes.
        r.decoded_bytes = r.bytes + static_cast<int64_t>(back.size());
        r.bytes = static_cast<int64_t>(total);
        return false;
      }
    }
    out->append(ids.data(), ids.size());
    r.bytes += static_cast<int64_t>(text.size());
    return true;
  };
  std::string block(std::max<size_t>(o.block_bytes, 1), '\0');
  for (const auto& f : o.texts) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw InputError(f + ": cannot open for reading (" + std::strerror(errno) + ")");
    // A file's text not yet checked as UTF-8: from the last newline on
    // (no character spans a newline), starting at byte `checked` of f.
    std::string pending;
    uint64_t checked = 0;
    const auto check = [&](std::string_view text) {
      // SentencePiece drops or replaces what is not UTF-8: the ids would not
      // decode back to the file (bytes, without --tokenizer, take anything).
      if (const size_t at = first_invalid_utf8(text); at != std::string_view::npos)
        throw InputError("--text: " + f + ": not UTF-8 at byte " + std::to_string(checked + at) +
                         " (expected UTF-8 text for a SentencePiece tokenizer; without "
                         "--tokenizer every byte is a token)");
      checked += text.size();
    };
    while (in) {
      in.read(block.data(), static_cast<std::streamsize>(block.size()));
      const auto n = static_cast<size_t>(in.gcount());
      if (n == 0) break;
      if (!tk) {
        encode(std::string_view(block.data(), n));
      } else {
        // Only the block just read can hold a newline: what was pending
        // before it is the text after the last one.
        pending.append(block.data(), n);
        const void* last = ::memrchr(pending.data() + pending.size() - n, '\n', n);
        if (last == nullptr) continue;  // a line longer than a block: read on
        const auto nl = static_cast<size_t>(static_cast<const char*>(last) - pending.data());
        const std::string_view lines(pending.data(), nl + 1);
        check(lines);
        if (piece.empty()) {  // the common case: no earlier file's last line to join
          if (!encode(lines)) return r;
        } else {
          piece.append(lines);
          if (!encode(piece)) return r;
          piece.clear();
        }
        pending.erase(0, nl + 1);
      }
      progress_line(show, std::min(static_cast<size_t>(r.bytes >> 20), total_mib - 1), total_mib,
                    "MiB tokenized");
    }
    if (in.bad()) throw SystemError(f + ": read failed (" + std::strerror(errno) + ")");
    check(pending);
    piece.append(pending);
  }
  if (!encode(piece)) return r;
  if (r.bytes == 0)
    throw InputError(
        "--text: " + (o.texts.size() == 1 ? o.texts[0] + " holds" : std::string("the texts hold")) +
        " no bytes; expected text to tokenize");
  r.seconds = encoding;
  r.tokens = out->count();
  r.verified = o.verify && tk.has_value();
  // No sidecar of an earlier token file beside this one, even for a moment:
  // an interrupt between the two renames leaves none (an unknown tokenizer),
  // never a wrong one.
  fs::remove(o.out + ".json", ec);
  out->commit();
  write_token_meta(o.out, o.tokenizer, o.texts, r.tokens, r.bytes);
  return r;
}

}  // namespace anvil::data
