// The Hugging Face adapters: each architecture's key table read both ways
// gives the config back, its tensor map covers every anvil tensor once, and
// the family picks the architecture that computes what the config does.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "anvil/ckpt/hf_adapter.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"
#include "support/input_error.hpp"

namespace anvil::ckpt {
namespace {

using json = nlohmann::json;

model::ModelConfig tiny(const std::string& name, std::vector<std::string> overrides = {}) {
  return model::load_model_config(
      std::string(ANVIL_SOURCE_DIR) + "/tests/configs/" + name + ".json", overrides);
}

// The configs each architecture expresses exactly.
std::vector<model::ModelConfig> exportable() {
  return {
      tiny("gpt2-tiny"), tiny("llama-tiny", {"rotary_dim=0"}),
      tiny("llama-tiny", {"rotary_dim=0", "tied_embeddings=true", "n_kv_heads=4", "attention=mha"}),
      // ZAYA1 has no dense MLP: import sets ffn_hidden to the expert width.
      tiny("zaya-tiny", {"skip_output=zero", "ffn_hidden=16"})};
}

TEST(HfAdapter, EachFamilyPicksTheArchitectureThatComputesItsConfig) {
  const auto c = exportable();
  EXPECT_EQ(hf_adapter(c[0].family).choose(c[0], "x").name, "GPT2LMHeadModel");
  EXPECT_EQ(hf_adapter(c[1].family).choose(c[1], "x").name, "LlamaForCausalLM");
  EXPECT_EQ(hf_adapter(c[3].family).choose(c[3], "x").name, "ZayaForCausalLM");
  const auto partial = tiny("llama-tiny");
  test_support::expect_input_error([&] { hf_adapter(partial.family).choose(partial, "ckpt"); },
                                   {"ckpt: config llama-tiny", "rotary_dim 8"});
  const auto input_skip = tiny("zaya-tiny");
  test_support::expect_input_error(
      [&] { hf_adapter(input_skip.family).choose(input_skip, "ckpt"); }, {"skip_output"});
}

TEST(HfAdapter, TheKeyTableReadsBackTheConfigItWrites) {
  for (const auto& c : exportable()) {
    const HfArchitecture& arch = hf_adapter(c.family).choose(c, "x");
    json j = hf_config_keys(arch, c);
    j["_name_or_path"] = c.name;
    const model::ModelConfig back = config_from_hf_keys(arch, {j}, "config.json");
    EXPECT_EQ(model::model_config_to_json(back), model::model_config_to_json(c)) << arch.name;
  }
}

TEST(HfAdapter, ImportDefaultsFollowTransformersConventions) {
  const HfArchitecture& llama = *dense_hf_adapter().architectures[1];
  const json j = {{"vocab_size", 100},
                  {"hidden_size", 64},
                  {"num_hidden_layers", 2},
                  {"num_attention_heads", 4},
                  {"max_position_embeddings", 32},
                  {"intermediate_size", 96}};
  const model::ModelConfig c = config_from_hf_keys(llama, {j}, "config.json");
  EXPECT_EQ(c.name, "imported-LlamaForCausalLM");
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.attention, model::Attention::mha);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e4);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.bias);
}

TEST(HfAdapter, ImportRefusesWhatAnvilCannotCompute) {
  const HfArchitecture& llama = *dense_hf_adapter().architectures[1];
  json j = {{"vocab_size", 100},
            {"hidden_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"max_position_embeddings", 32},
            {"intermediate_size", 96}};
  auto refused = [&](json bad, const std::string& why) {
    test_support::expect_input_error([&] { config_from_hf_keys(llama, {bad}, "c.json"); },
                                     {"c.json: " + why});
  };
  json k = j;
  k.erase("hidden_size");
  refused(k, "no number hidden_size");
  for (const json& bad : {json(1.26667e33), json(64.5), json(18446744073709551615u)}) {
    k = j;
    k["hidden_size"] = bad;
    refused(k, "hidden_size: expected an integer, got " + bad.dump());
  }
  k = j;
  k["hidden_size"] = 64.0;  // an exporter's float with an integral value is read
  EXPECT_EQ(config_from_hf_keys(llama, {k}, "c.json").d_model, 64);
  k = j;
  k["hidden_act"] = "gelu";
  refused(k, "hidden_act \"gelu\" (expected silu)");
  k = j;
  k["mlp_bias"] = true;
  refused(k, "attention_bias and mlp_bias differ");
  k = j;
  k["rope_scaling"] = {{"factor", 2}};
  refused(k, "rope_scaling is set");
}

TEST(HfAdapter, TheOriginalLayoutHalvesZyphrasLayerCount) {
  const HfArchitecture& zaya = *zaya1_hf_adapter().architectures[0];
  const auto c = tiny("zaya-tiny", {"skip_output=zero"});
  const json j = zaya1_hf_adapter().original->config(c, hf_config_keys(zaya, c));
  EXPECT_EQ(j["num_hidden_layers"], 2 * c.n_layers);
  EXPECT_FALSE(j.contains("rope_parameters"));
  const model::ModelConfig back = config_from_hf_keys(zaya, {j, true}, "config.json");
  EXPECT_EQ(back.n_layers, c.n_layers);
  EXPECT_EQ(back.rotary_dim, c.rotary_dim);
  json odd = j;
  odd["num_hidden_layers"] = 3;
  test_support::expect_input_error(
      [&] {
        config_from_hf_keys(zaya, {odd, true}, "c.json");
      },
      {"num_hidden_layers 3 in the original layout"});
  EXPECT_TRUE(zaya1_hf_adapter().original->shows(
      "model.layers.1.zaya_block.experts.local_experts.0.linear_fc1.weight"));
  EXPECT_FALSE(zaya1_hf_adapter().original->shows("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(dense_hf_adapter().original, nullptr);
  // Without RoPE keys: the original layout is ZAYA1's (theta 1e4, half of
  // each head), transformers' layout its ZayaConfig defaults (5e6, half).
  json bare = j;
  bare.erase("rope_theta");
  bare.erase("partial_rotary_factor");
  const model::ModelConfig o = config_from_hf_keys(zaya, {bare, true}, "config.json");
  EXPECT_EQ(o.rope_theta, 1e4);
  EXPECT_EQ(o.rotary_dim, o.head_dim / 2);
  json port = hf_config_keys(zaya, c);
  ASSERT_TRUE(port.contains("rope_parameters"));
  port.erase("rope_parameters");
  const model::ModelConfig t = config_from_hf_keys(zaya, {port, false}, "config.json");
  EXPECT_EQ(t.rope_theta, 5e6);
  EXPECT_EQ(t.rotary_dim, t.head_dim / 2);
  port["partial_rotary_factor"] = 0.25;  // an older config's key at the top
  EXPECT_EQ(config_from_hf_keys(zaya, {port, false}, "config.json").rotary_dim, t.head_dim / 4);
}

TEST(HfAdapter, TensorMapsCoverEveryAnvilTensorOnce) {
  for (const auto& c : exportable()) {
    const model::ModelFamily& family = model::model_family(c);
    std::multiset<std::string> want, mapped;
    const model::ParamRegistry registry = family.registry(c);
    for (const auto& s : registry.specs()) want.insert(s.name);
    for (const auto& [name, shape] : family.extra_state_shapes(c)) want.insert(name);
    const HfArchitecture& arch = hf_adapter(c.family).choose(c, "x");
    std::set<std::string> names;
    for (const auto& t : arch.tensors(c)) {
      EXPECT_TRUE(names.insert(t.name).second) << t.name;
      mapped.insert(t.parts.begin(), t.parts.end());
    }
    EXPECT_EQ(mapped, want) << arch.name;
  }
}

}  // namespace
}  // namespace anvil::ckpt
