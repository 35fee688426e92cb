// The model-family seam: a config's family, what each family builds and
// counts, and the one FLOP count the trainer, the GEMM benchmark and the
// planner share.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/gemm_shapes.hpp"
#include "support/input_error.hpp"

namespace anvil::model {
namespace {

ModelConfig preset(const std::string& name, std::vector<std::string> overrides = {}) {
  return load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/" + name + ".json", overrides);
}

ModelConfig tiny(const std::string& name, std::vector<std::string> overrides = {}) {
  return load_model_config(std::string(ANVIL_SOURCE_DIR) + "/tests/configs/" + name + ".json",
                           overrides);
}

TEST(ModelFamily, ChosenFromAttentionWhenTheConfigNamesNone) {
  EXPECT_EQ(preset("gpt2-124m").family, Family::dense);
  EXPECT_EQ(preset("llama-style").family, Family::dense);
  EXPECT_EQ(preset("zaya1-base").family, Family::zaya1);
  // Overrides apply first: the family follows the attention they leave.
  EXPECT_EQ(
      preset("zaya-tiny", {"attention=gqa", "n_experts=0", "router_dim=0", "expert_ffn_hidden=0"})
          .family,
      Family::dense);
  EXPECT_EQ(model_family(preset("zaya1-base")).name(), "zaya1");
}

TEST(ModelFamily, AnExplicitFamilyKeyIsParsedAndWrittenBackOnlyWhenItDiffers) {
  const ModelConfig c = parse_model_config(R"({"family": "dense"})", "x.json");
  EXPECT_EQ(c.family, Family::dense);
  EXPECT_EQ(model_config_to_json(c).find("family"), std::string::npos);
  const ModelConfig z = parse_model_config(
      R"({"family": "zaya1", "attention": "cca", "n_kv_heads": 2, "n_experts": 2,
          "expert_ffn_hidden": 8, "router_dim": 4, "tied_embeddings": true})",
      "x.json");
  EXPECT_EQ(z.family, Family::zaya1);
  EXPECT_EQ(parse_model_config(model_config_to_json(z), "round trip").family, Family::zaya1);
  // A family whose layers the other keys do not fit is refused, naming the key.
  test_support::expect_input_error(
      [] { parse_model_config(R"({"family": "zaya1"})", "x.json"); },
      {"x.json: attention: the zaya1 family needs \"cca\", got \"mha\""});
  test_support::expect_input_error([] { parse_model_config(R"({"family": "moe"})", "x.json"); },
                                   {"x.json: family: expected one of dense | zaya1, got \"moe\""});
}

TEST(ModelFamily, ShippedConfigsRoundTripThroughTheEnumsUnchanged) {
  for (const char* name :
       {"gpt2-124m", "llama-style", "byte-small", "zaya-small", "zaya-tiny", "zaya1-base"}) {
    const std::string once = model_config_to_json(preset(name));
    EXPECT_EQ(model_config_to_json(parse_model_config(once, name)), once) << name;
    EXPECT_EQ(once.find("family"), std::string::npos) << name;
  }
  const std::string j = model_config_to_json(preset("llama-style"));
  EXPECT_NE(j.find("\"mlp\": \"swiglu\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"attention\": \"gqa\""), std::string::npos) << j;
}

TEST(ModelFamily, RegisteredByNameInOrder) {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) names.push_back(f->name());
  EXPECT_EQ(names, (std::vector<std::string>{"dense", "zaya1"}));
  EXPECT_EQ(&model_family(Family::zaya1), &zaya1_family());
  EXPECT_FALSE(dense_family().has_experts());
  EXPECT_TRUE(zaya1_family().has_experts());
}

TEST(ModelFamily, BuiltModelsHoldTheFamilysRegistryAndPlan) {
  for (const ModelConfig& c : {tiny("gpt2-tiny"), tiny("zaya-tiny")}) {
    const ModelFamily& f = model_family(c);
    ModelOptions o;
    o.batch = 2;
    o.seq = 16;
    const auto m = f.make_model(c, o);
    EXPECT_EQ(m->registry().total(), f.registry(c).total()) << c.name;
    const MemoryPlan p = f.memory_plan(c, o);
    EXPECT_EQ(p.parameters, m->plan().parameters) << c.name;
    EXPECT_EQ(p.gradients, m->plan().gradients) << c.name;
    EXPECT_EQ(p.activations, m->plan().activations) << c.name;
    EXPECT_EQ(m->has_experts(), f.has_experts()) << c.name;
  }
}

TEST(ModelFamily, OnlyTheZaya1FamilyHasExpertsToDispatch) {
  const auto dense = dense_family().make_model(tiny("gpt2-tiny"), {});
  EXPECT_FALSE(dense->has_experts());
  EXPECT_EQ(dense->take_dispatch_seconds(), 0.0);
  ModelOptions o;
  o.seq = 8;
  EXPECT_TRUE(zaya1_family().make_model(tiny("zaya-tiny"), o)->has_experts());
}

TEST(ModelFamily, ExpertRangeReachesTheZaya1Registry) {
  const ModelConfig c = tiny("zaya-tiny", {"n_experts=4"});
  ModelOptions o;
  o.seq = 8;
  o.experts = {2, 2};
  const auto half = zaya1_family().make_model(c, o);
  const auto all = zaya1_family().registry(c);
  EXPECT_EQ(half->registry().total(), zaya1_family().registry(c, {2, 2}).total());
  EXPECT_LT(half->registry().total(), all.total());
  EXPECT_NE(
      half->registry().find("model.layers.1.zaya_block.experts.local_experts.3.linear_fc1.weight"),
      nullptr);
  EXPECT_EQ(
      half->registry().find("model.layers.1.zaya_block.experts.local_experts.0.linear_fc1.weight"),
      nullptr);
}

TEST(ModelFamily, DecodingModelsEqualTheFullForwardRowByRow) {
  for (const ModelConfig& c : {tiny("llama-tiny"), tiny("zaya-tiny")}) {
    const ModelFamily& f = model_family(c);
    const int64_t T = 5, V = c.vocab_size;
    ModelOptions o;
    o.seq = T;
    o.training = false;
    const auto full = f.make_model(c, o);
    const auto dec = f.make_decoding_model(c, device::DeviceKind::cpu);
    f.registry(c).initialize(full->params(), 3);
    f.registry(c).initialize(dec->weights().params(), 3);
    std::vector<int32_t> tokens = {3, 1, 4, 1, 5}, targets(T, -1);
    std::vector<float> logits(static_cast<size_t>(V));
    dec->start_decode(T);
    double nll = 0;
    for (int64_t t = 0; t < T; ++t) {
      dec->decode_step(tokens[t], t, logits.data());
      if (t + 1 < T) {
        double mx = logits[0], sum = 0;
        for (float l : logits) mx = std::max<double>(mx, l);
        for (float l : logits) sum += std::exp(l - mx);
        nll += mx + std::log(sum) - logits[tokens[t + 1]];
        targets[t] = tokens[t + 1];
      }
    }
    int64_t scored = 0;
    const double loss = full->forward(tokens.data(), targets.data(), 1, T, &scored);
    EXPECT_EQ(scored, T - 1);
    EXPECT_NEAR(loss, nll, 1e-3 * std::abs(nll)) << c.name;
  }
}

TEST(FlopsPerToken, DenseTrainingCountsSixPerWeightPlusAttention) {
  const auto c = preset("gpt2-124m");
  // 85M matrix weights + 38.6M classifier = 123.6M; 6x = 741.9 MFLOP, plus attention.
  const double matmul = 12.0 * (768.0 * 2304 + 768.0 * 768 + 2 * 768.0 * 3072) + 50304.0 * 768;
  EXPECT_NEAR(training_flops_per_token(c, 1), 6 * matmul + 3 * 12 * 4 * 768.0, 1.0);
  // The trainer's count is the GEMM list's: one counter.
  EXPECT_EQ(training_flops_per_token(c, 1024), flops_per_token(c, 1024).training());
}

TEST(FlopsPerToken, AttentionIsCausalQkAndPvPerHead) {
  const auto c = preset("llama-style");
  const FlopsPerToken f = flops_per_token(c, 2048);
  EXPECT_DOUBLE_EQ(f.attention, causal_attention_flops(c.head_dim, 2048) *
                                    static_cast<double>(c.n_heads * c.n_layers) / 2048);
  EXPECT_DOUBLE_EQ(causal_attention_flops(64, 3), 4.0 * 64 * 3 * 4 / 2);
}

// One count for every family: the trainer's MFU reads what the planner
// prices (the matmuls of the GEMM list, the router's and the convolutions'
// included, and causal attention).
TEST(FlopsPerToken, TheTrainerAndThePlannerShareOneCount) {
  for (const auto& [c, T] : {std::pair{preset("zaya1-base"), int64_t{4096}},
                             std::pair{tiny("zaya-tiny"), int64_t{32}},
                             std::pair{preset("gpt2-124m"), int64_t{1024}}})
    EXPECT_EQ(training_flops_per_token(c, T), flops_per_token(c, T).training()) << c.name;
}

TEST(LayerGemms, EachFamilyListsItsOwnAttention) {
  std::set<std::string> dense, zaya;
  for (const auto& g : layer_gemms(preset("gpt2-124m"), 64, 0, false)) dense.insert(g.name);
  for (const auto& g : layer_gemms(preset("zaya1-base"), 64, 8, false)) zaya.insert(g.name);
  EXPECT_TRUE(dense.count("attn.qkv.fwd"));
  EXPECT_FALSE(dense.count("attn.conv.fwd"));
  EXPECT_TRUE(zaya.count("attn.conv.fwd"));
  EXPECT_TRUE(zaya.count("router.mlp2.fwd"));
  EXPECT_FALSE(zaya.count("attn.qkv.fwd"));
}

TEST(SavedActivations, Zaya1AddsTheConvolutionsAndTheResidualMerges) {
  const auto c = preset("zaya1-base");
  const BlockActivations base = dense_family().saved_activations(c, false);
  const BlockActivations z = zaya1_family().saved_activations(c, false);
  const double q = static_cast<double>(c.n_heads * c.head_dim), kv = 2.0 * c.head_dim;
  const double C = static_cast<double>(c.d_model);
  EXPECT_DOUBLE_EQ(z.attention - base.attention, 2 * (q + kv) + C);
  EXPECT_DOUBLE_EQ(z.mlp - base.mlp, C);
  // Under EP each routed row received is kept once more.
  EXPECT_DOUBLE_EQ(zaya1_family().saved_activations(c, true).mlp - z.mlp, c.top_k * C);
  EXPECT_EQ(zaya1_family().fixed_kv_heads(), 2);
  EXPECT_EQ(dense_family().fixed_kv_heads(), 0);
}

}  // namespace
}  // namespace anvil::model
