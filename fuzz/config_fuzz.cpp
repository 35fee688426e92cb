// libFuzzer: model config JSON (parse, validate, and write back).
#include "anvil/base/error.hpp"
#include "anvil/model/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto c = anvil::model::parse_model_config(text, "fuzz.json");
    const auto again = anvil::model::parse_model_config(anvil::model::model_config_to_json(c), "again");
    if (anvil::model::model_config_to_json(again) != anvil::model::model_config_to_json(c))
      std::abort();  // what it writes it reads back the same
  } catch (const anvil::InputError&) {
  }
  return 0;
}
