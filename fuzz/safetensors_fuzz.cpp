// libFuzzer: the safetensors reader (checkpoints of version 1, imports).
#include "anvil/base/error.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = anvil::fuzz::scratch_dir() + "/in.safetensors";
  anvil::fuzz::put(path, data, size);
  try {
    const auto f = anvil::ckpt::read_safetensors(path);
    for (const auto& [name, t] : f.tensors) {
      size_t n = 1;
      for (auto d : t.shape) n *= static_cast<size_t>(d);
      if (n != t.data.size()) std::abort();  // the reader promised numel floats
    }
  } catch (const anvil::InputError&) {
  }
  return 0;
}
