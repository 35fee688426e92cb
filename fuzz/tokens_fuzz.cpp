// libFuzzer: token files (header, vocabulary check) and the text fallback.
#include "anvil/base/error.hpp"
#include "anvil/data/tokens.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = anvil::fuzz::scratch_dir() + "/in.tok";
  anvil::fuzz::put(path, data, size);
  try {
    anvil::data::TokenData t(path);
    if (t.size() > 0) {
      std::vector<int32_t> out(static_cast<size_t>(std::min<int64_t>(t.size(), 64)));
      t.copy(out.data(), 0, static_cast<int64_t>(out.size()));
      for (int32_t id : out)
        if (id < 0 || id >= t.vocab_size()) std::abort();  // checked on opening
    }
  } catch (const anvil::InputError&) {
  }
  return 0;
}
