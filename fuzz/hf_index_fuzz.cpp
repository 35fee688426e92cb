// libFuzzer: a Hugging Face model.safetensors.index.json (the weight map of
// a sharded export) over fixed shard files: HfWeights must refuse any
// damage with InputError, never read outside the folder or crash.
#include <filesystem>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/ckpt/hf_files.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = anvil::fuzz::scratch_dir() + "/hf";
    std::filesystem::create_directories(d);
    std::vector<float> a(12, 1.0f), b(6, 2.0f);
    anvil::ckpt::write_safetensors(d + "/model-00001-of-00002.safetensors", {{"a", {3, 4}, a.data()}});
    anvil::ckpt::write_safetensors(d + "/model-00002-of-00002.safetensors", {{"b", {6}, b.data()}});
    return d;
  }();
  anvil::fuzz::put(dir + "/model.safetensors.index.json", data, size);
  try {
    const anvil::ckpt::HfWeights weights(dir);
    for (const auto& [name, shape] : weights.shapes()) (void)weights.read(name);
  } catch (const anvil::InputError&) {
  }
  return 0;
}
