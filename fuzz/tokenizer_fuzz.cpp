// libFuzzer: a tokenizer model file (SentencePiece's protobuf, as
// `--tokenizer` and a checkpoint's tokenizer.model give it): loaded, then a
// short text encoded and decoded, and its tokenizer.json derived.
#include "anvil/base/error.hpp"
#include "anvil/data/tokenizer.hpp"
#include "anvil/data/tokenizer_json.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = anvil::fuzz::scratch_dir() + "/tokenizer.model";
  anvil::fuzz::put(path, data, size);
  try {
    const anvil::data::Tokenizer t(path);
    const auto ids = t.encode("In the beginning 42 \xe2\x80\x94 words.");
    (void)t.decode(ids);
  } catch (const anvil::InputError&) {
  }
  try {
    (void)anvil::data::sentencepiece_tokenizer_json(path);
  } catch (const anvil::InputError&) {
  }
  return 0;
}
