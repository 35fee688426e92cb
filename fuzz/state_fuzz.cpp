// libFuzzer: a checkpoint's state.json (read_state checks every field a
// resume reads; the trainer's resume rules then only compare values).
#include <filesystem>

#include "anvil/base/error.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = anvil::fuzz::scratch_dir() + "/state";
    std::filesystem::create_directories(d);
    return d;
  }();
  anvil::fuzz::put(dir + "/state.json", data, size);
  try {
    const auto s = anvil::ckpt::read_state(dir);
    // What the trainer reads after the check.
    (void)s.at("step").get<int64_t>();
    (void)s.at("seed").get<uint64_t>();
    (void)s.at("config").dump();
    for (const char* key : {"batch", "seq", "accum"}) (void)s.at(key).get<int64_t>();
  } catch (const anvil::InputError&) {
  }
  return 0;
}
