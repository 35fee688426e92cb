// The "dense" family: the pre-norm decoder of the GPT-2 and Llama shapes
// (decoder.hpp; device_decoder.hpp on a GPU), its parameters counted from
// the registry it trains with.
#include <memory>

#include "anvil/base/env_choice.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/device_decoder.hpp"
#include "anvil/model/family.hpp"

namespace anvil::model {
namespace {

// Whether a model is the DeviceDecoder: on a GPU always; on the CPU when
// ANVIL_CPU_MODEL=device asks for it (the GPU path's orchestration on the
// CPU's engine and layers, for tests; default: decoder).
bool device_model(device::DeviceKind device) {
  if (device != device::DeviceKind::cpu) return true;
  static const bool on_cpu = env_choice("ANVIL_CPU_MODEL", {"decoder", "device"}) == "device";
  return on_cpu;
}

// What the DeviceDecoder does not build, as the InputError naming it.
void check_device_model(const ModelOptions& o) {
  if (o.context != nullptr && o.context->size() > 1) {
    throw InputError(std::string(o.device == device::DeviceKind::cpu ? "ANVIL_CPU_MODEL=device"
                                                                     : "--device cuda") +
                     ": the device decoder has no context parallelism (expected --cp 1)");
  }
}

class DenseFamily final : public ModelFamily {
 public:
  Family id() const override { return Family::dense; }

  ParamRegistry registry(const ModelConfig& config, ExpertRange /*experts*/) const override {
    return decoder_registry(config);
  }

  MemoryPlan memory_plan(const ModelConfig& config, const ModelOptions& o) const override {
    if (device_model(o.device))
      return DeviceDecoder::plan_for(config, o.batch, o.seq, o.training, o.precision,
                                     DeviceDecoder::fuses_attention(o.device, o.precision));
    return Decoder::plan_for(config, o.batch, o.seq, o.training, o.precision,
                             o.context ? o.context->size() : 1);
  }

  std::unique_ptr<TrainableModel> make_model(const ModelConfig& config,
                                             const ModelOptions& o) const override {
    if (device_model(o.device)) {
      check_device_model(o);
      return std::make_unique<DeviceDecoder>(config, o.batch, o.seq, o.training, o.device,
                                             o.precision, o.tf32);
    }
    return std::make_unique<Decoder>(config, o.batch, o.seq, o.training, o.precision, o.context);
  }

  std::unique_ptr<DecodingModel> make_decoding_model(const ModelConfig& config,
                                                     device::DeviceKind device) const override {
    if (device_model(device)) {
      return std::make_unique<DecodingAdapter<DeviceDecoder>>(
          std::make_unique<DeviceDecoder>(config, 1, 1, /*training=*/false, device));
    }
    return std::make_unique<DecodingAdapter<Decoder>>(
        std::make_unique<Decoder>(config, 1, 1, /*training=*/false));
  }

  ParamCount count_parameters(const ModelConfig& config) const override {
    return count_registry(config.name, decoder_registry(config));
  }

  std::vector<GemmShape> layer_gemms(const ModelConfig& c, int64_t tokens,
                                     int64_t tokens_per_expert, bool backward) const override {
    const int64_t q = c.n_heads * c.head_dim;
    const int64_t kv = c.n_kv_heads * c.head_dim;
    GemmList list(backward);
    list.linear("attn.qkv", tokens, c.d_model, q + 2 * kv);
    list.linear("attn.out", tokens, q, c.d_model);
    ffn_gemms(list, c, tokens, tokens_per_expert);
    list.linear("lm_head", tokens, c.d_model, c.vocab_size);
    return list.take();
  }
};

}  // namespace

const ModelFamily& dense_family() {
  static const DenseFamily family;
  return family;
}

}  // namespace anvil::model
