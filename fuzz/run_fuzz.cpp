// libFuzzer: a run file (RUN/train.json, read back by `anvil train --train`):
// every option's type and range is checked, unknown keys refused.
#include "anvil/base/error.hpp"
#include "anvil/train/options.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = anvil::fuzz::scratch_dir() + "/train.json";
  anvil::fuzz::put(path, data, size);
  try {
    (void)anvil::train::load_train_options(path);
  } catch (const anvil::InputError&) {
  }
  return 0;
}
