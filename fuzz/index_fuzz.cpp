// libFuzzer: the sharded checkpoint index (index.json) over a fixed shard
// file: verify_checkpoint, read_tensors and load_pieces must reject any
// damage with CorruptCheckpoint / InputError, never crash or allocate what
// the files cannot hold.
#include <filesystem>

#include "anvil/base/error.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "fuzz_common.hpp"

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = anvil::fuzz::scratch_dir() + "/step-00000001";
    std::filesystem::create_directories(d);
    std::vector<float> v(64);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    anvil::ckpt::write_safetensors(d + "/rank-00000.safetensors", {{"a@0", {64}, v.data()}});
    const std::string state =
        R"({"format": "anvil-train-state", "step": 1, "config": {}, "seed": 1, "batch": 1, "seq": 1, "accum": 1})";
    anvil::fuzz::put(d + "/state.json", reinterpret_cast<const uint8_t*>(state.data()), state.size());
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  anvil::fuzz::put(dir + "/index.json", data, size);
  (void)anvil::ckpt::verify_checkpoint(dir);
  try {
    (void)anvil::ckpt::read_tensors(dir, "model");
  } catch (const anvil::InputError&) {
  }
  try {
    std::vector<float> out(16);
    anvil::ckpt::load_pieces(
        dir, {{"a", {64}, 8, 16, 0, anvil::model::Sharding::replicated, out.data()}});
  } catch (const anvil::InputError&) {
  }
  return 0;
}
