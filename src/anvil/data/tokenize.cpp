#include "anvil/data/tokenize.hpp"

#include <filesystem>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/data/tokens.hpp"

namespace anvil::data {

TokenizeResult tokenize_files(const TokenizeOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& f : o.texts) {  // the output would replace its own input
    if (fs::exists(o.out, ec) && fs::equivalent(f, o.out, ec))
      throw InputError("--out: " + o.out + " is the input text " + f +
                       "; expected another path for the token file");
    if (fs::exists(o.out + ".json", ec) && fs::equivalent(f, o.out + ".json", ec))
      throw InputError("--out: " + o.out + ".json (its sidecar) is the input text " + f);
  }
  std::string text;
  for (const auto& f : o.texts) {
    const std::string part = read_file(f);
    // SentencePiece drops or replaces what is not UTF-8: the ids would not
    // decode back to the file (bytes, without --tokenizer, take anything).
    if (!o.tokenizer.empty())
      if (const size_t at = first_invalid_utf8(part); at != std::string_view::npos)
        throw InputError("--text: " + f + ": not UTF-8 at byte " + std::to_string(at) +
                         " (expected UTF-8 text for a SentencePiece tokenizer; without "
                         "--tokenizer every byte is a token)");
    text += part;
  }
  if (text.empty())
    throw InputError(
        "--text: " + (o.texts.size() == 1 ? o.texts[0] + " holds" : std::string("the texts hold")) +
        " no bytes; expected text to tokenize");
  TokenizeResult r;
  r.bytes = static_cast<int64_t>(text.size());
  if (o.tokenizer.empty()) {
    const auto tokens = encode_bytes(text);
    write_token_file(o.out, tokens, 256);
    write_token_meta(o.out, "", o.texts, static_cast<int64_t>(tokens.size()), r.bytes);
    r.tokens = static_cast<int64_t>(tokens.size());
    r.vocab = 256;
    return r;
  }
  const Tokenizer tk(o.tokenizer);
  const double t0 = now_seconds();
  const auto tokens = tk.encode(text, o.threads);
  r.seconds = now_seconds() - t0;
  r.tokens = static_cast<int64_t>(tokens.size());
  r.vocab = tk.vocab_size();
  if (o.verify) {
    const std::string back = tk.decode(tokens);
    if (back != text) {
      size_t at = 0;
      while (at < back.size() && at < text.size() && back[at] == text[at]) ++at;
      r.differs = true;
      r.first_difference = static_cast<int64_t>(at);
      r.decoded_bytes = static_cast<int64_t>(back.size());
      return r;
    }
    r.verified = true;
  }
  write_token_file(o.out, tokens, tk.vocab_size());
  write_token_meta(o.out, o.tokenizer, o.texts, r.tokens, r.bytes);
  return r;
}

}  // namespace anvil::data
