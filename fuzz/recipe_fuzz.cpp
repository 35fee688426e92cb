// libFuzzer: a training recipe (phases, mixtures, schedules), read and
// planned for 1 and 4 ranks.
#include "anvil/base/error.hpp"
#include "anvil/train/recipe_file.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = anvil::fuzz::scratch_dir() + "/recipe.json";
  anvil::fuzz::put(path, data, size);
  for (int world : {1, 4}) {
    try {
      (void)anvil::train::load_recipe(path, world);
    } catch (const anvil::InputError&) {
    }
  }
  return 0;
}
