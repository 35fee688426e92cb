#include <gtest/gtest.h>

#include "anvil/base/error.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/gemm_shapes.hpp"
#include "anvil/model/zaya_model.hpp"
#include "anvil/optim/adamw.hpp"

#include <cmath>
#include <vector>

namespace anvil::model {
namespace {

const std::string kConfigs = std::string(ANVIL_SOURCE_DIR) + "/configs/";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelConfig, LoadsShippedPresets) {
  const ModelConfig gpt2 = load_model_config(kConfigs + "gpt2-124m.json");
  EXPECT_EQ(gpt2.d_model, 768);
  EXPECT_EQ(gpt2.vocab_size, 50304);
  const ModelConfig zaya = load_model_config(kConfigs + "zaya1-base.json");
  EXPECT_EQ(zaya.attention, Attention::cca);
  EXPECT_EQ(zaya.n_experts, 16);
  // ZAYA1 rotates the first 64 of each head's 128 channels.
  EXPECT_EQ(zaya.head_dim, 128);
  EXPECT_EQ(zaya.rotary_dim, 64);
  EXPECT_EQ(zaya.rope_theta, 1e4);
}

// ZAYA1's key temperature starts at the config's value (the public port's
// 0, or 1 by default); the value survives the checkpoint's config text.
TEST(Config, ZayaKeyTemperatureStartsAtTheConfiguredValue) {
  const std::string tiny = std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json";
  for (const double init : {1.0, 0.0, 0.5}) {
    const ModelConfig c = load_model_config(tiny, {"key_temp_init=" + std::to_string(init)});
    EXPECT_EQ(c.key_temp_init, init);
    const ModelConfig again = parse_model_config(model_config_to_json(c), "again");
    EXPECT_EQ(again.key_temp_init, init);
    const ParamRegistry r = model_family(c).registry(c);
    std::vector<float> params(static_cast<size_t>(r.total()), -7.0f);
    r.initialize(params.data(), 3);
    int temps = 0;
    for (const auto& s : r.specs()) {
      if (s.name.find("qkv.temp") == std::string::npos) continue;
      ++temps;
      for (int64_t i = 0; i < s.numel; ++i)
        EXPECT_EQ(params[static_cast<size_t>(s.offset + i)], static_cast<float>(init)) << s.name;
    }
    EXPECT_EQ(temps, c.n_layers);
  }
  EXPECT_NE(error_of([&] {
              load_model_config(tiny, {"key_temp_init=\"one\""});
            }).find("key_temp_init: expected a number"),
            std::string::npos);
}

TEST(ModelConfig, OverridesApplyAfterTheFile) {
  const ModelConfig c =
      load_model_config(kConfigs + "gpt2-124m.json", {"d_model=1024", "mlp=swiglu"});
  EXPECT_EQ(c.d_model, 1024);
  EXPECT_EQ(c.mlp, Mlp::swiglu);
}

TEST(ModelConfig, UnknownKeyNamesFileAndKey) {
  const std::string e = error_of([] { parse_model_config(R"({"d_modle": 5})", "x.json"); });
  EXPECT_NE(e.find("x.json: d_modle: unknown key"), std::string::npos) << e;
}

TEST(ModelConfig, BadValuesNameTheKeyAndExpectation) {
  EXPECT_NE(error_of([] {
              parse_model_config(R"({"n_heads": 0})", "x.json");
            }).find("n_heads: expected an integer from 1 to 4096, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_model_config(R"({"mlp": "relu"})", "x.json");
            }).find("expected one of gelu | swiglu"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_model_config("{}", "x.json", {"d_model"});
            }).find("--set d_model: expected key=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_model_config("[1]", "x.json"); }).find("expected a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_model_config("{", "x.json"); }).find("not valid JSON"),
            std::string::npos);
}

// Sizes whose products would leave int64 (a segfault or a hang before), a
// RoPE base that rounds to 0 in fp32, and a family's needs are refused with
// the key named; a rule an override breaks names the override.
TEST(ModelConfig, SizesHaveCeilingsAndFamilyRulesNameTheirKey) {
  auto error = [](const std::string& text, std::vector<std::string> set = {}) {
    return error_of([&] { parse_model_config(text, "x.json", set); });
  };
  EXPECT_NE(error(R"({"seq_len": 4611686018427387904})").find("seq_len: expected an integer"),
            std::string::npos);
  EXPECT_NE(error(R"({"rope_theta": 1e-50})").find("rope_theta: expected a number 1.0 <= x"),
            std::string::npos);
  EXPECT_NE(error(R"({"router_init_std": 1e30})").find("router_init_std"), std::string::npos);
  const std::string huge = error(
      R"({"d_model": 65536, "n_layers": 4096, "attention": "cca", "n_kv_heads": 2,
          "n_experts": 4096, "expert_ffn_hidden": 262144, "router_dim": 64})");
  EXPECT_NE(huge.find("x.json: the model would have ~"), std::string::npos) << huge;
  const std::string zaya = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/zaya-tiny.json";
  const std::string kv = error_of([&] { load_model_config(zaya, {"n_kv_heads=4"}); });
  EXPECT_NE(kv.find("with --set n_kv_heads=4: n_kv_heads: the zaya1 family needs 2"),
            std::string::npos)
      << kv;
  EXPECT_NE(error(R"({"n_experts": 4, "expert_ffn_hidden": 8})")
                .find("n_experts: the dense family needs 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"head_dim": 7, "position": "rope"})").find("rotary_dim 0 rotates all of head_dim (7)"),
            std::string::npos);
  EXPECT_NO_THROW(parse_model_config(R"({"head_dim": 7, "position": "learned"})", "x.json"));
}

TEST(ModelConfig, RouterInitStdRoundTripsAndInitialisesTheRouterMlp) {
  const ModelConfig c = load_model_config(
      std::string(ANVIL_SOURCE_DIR) + "/tests/configs/zaya-tiny.json", {"router_init_std=0.25"});
  EXPECT_EQ(parse_model_config(model_config_to_json(c), "round trip").router_init_std, 0.25);
  EXPECT_NE(error_of([] {
              parse_model_config(R"({"router_init_std": 0})", "x.json");
            }).find("router_init_std"),
            std::string::npos);
  const ParamRegistry r = zaya_registry(c);
  std::vector<float> p(static_cast<size_t>(r.total()));
  r.initialize(p.data(), 1);
  auto rms = [&](const std::string& name) {
    const auto& s = r.get(name);
    double sum = 0;
    for (int64_t i = 0; i < s.numel; ++i)
      sum += static_cast<double>(p[s.offset + i]) * p[s.offset + i];
    return std::sqrt(sum / static_cast<double>(s.numel));
  };
  for (const char* m : {"router_mlp.0.weight", "router_mlp.2.weight", "router_mlp.4.weight"}) {
    EXPECT_NEAR(rms(std::string("model.layers.1.zaya_block.router.") + m), 0.25, 0.05) << m;
  }
  // Everything else keeps docs/zaya1-spec.md section 8's N(0, 0.02).
  EXPECT_NEAR(rms("model.layers.1.zaya_block.router.down_proj.weight"), 0.02, 0.004);
}

TEST(ModelConfig, RouterLrScaleSlowsTheRouterOnly) {
  const std::string path = std::string(ANVIL_SOURCE_DIR) + "/tests/configs/zaya-tiny.json";
  const ModelConfig c = load_model_config(path, {"router_lr_scale=0.25"});
  EXPECT_EQ(parse_model_config(model_config_to_json(c), "round trip").router_lr_scale, 0.25);
  // Unset, the key is not written: earlier checkpoints' configs still match.
  EXPECT_EQ(model_config_to_json(load_model_config(path)).find("router_lr_scale"),
            std::string::npos);
  const ParamRegistry r = zaya_registry(c);
  std::vector<float> p(static_cast<size_t>(r.total()), 0.0f), g(p.size(), 1.0f);
  optim::AdamW adamw(r, optim::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.0f});
  adamw.update(p.data(), g.data(), 1e-2f, 1);
  // Adam's first step moves every parameter by lr times its scale.
  for (const char* name : {"model.layers.1.zaya_block.router.router_mlp.4.weight",
                           "model.layers.1.zaya_block.router.down_proj.bias",
                           "model.layers.0.self_attn.o_proj.weight", "model.embed_tokens.weight"}) {
    const auto& s = r.get(name);
    const bool router = std::string(name).find(".router.") != std::string::npos;
    EXPECT_EQ(s.lr_scale, router ? 0.25f : 1.0f) << name;
    EXPECT_NEAR(p[s.offset], router ? -2.5e-3f : -1e-2f, 1e-6f) << name;
  }
}

TEST(ModelConfig, InconsistentHeadsAreRejected) {
  const std::string e = error_of([] {
    parse_model_config(R"({"attention": "gqa", "n_heads": 12, "n_kv_heads": 5})", "x.json");
  });
  EXPECT_NE(e.find("multiple of n_kv_heads"), std::string::npos) << e;
}

TEST(LayerGemms, Gpt2ForwardShapes) {
  const ModelConfig c = load_model_config(kConfigs + "gpt2-124m.json");
  const auto g = layer_gemms(c, 1024, 0, false);
  ASSERT_EQ(g.size(), 5u);
  EXPECT_EQ(g[0].name, "attn.qkv.fwd");
  EXPECT_EQ(g[0].m, 1024);
  EXPECT_EQ(g[0].n, 3 * 768);
  EXPECT_EQ(g[0].k, 768);
  EXPECT_EQ(g[2].name, "mlp.up.fwd");
  EXPECT_EQ(g[2].n, 3072);
  EXPECT_EQ(g[4].name, "lm_head.fwd");
  EXPECT_EQ(g[4].n, 50304);
}

TEST(LayerGemms, BackwardAddsDgradAndWgrad) {
  const ModelConfig c = load_model_config(kConfigs + "gpt2-124m.json");
  const auto g = layer_gemms(c, 256, 0, true);
  ASSERT_EQ(g.size(), 15u);
  // out projection: y[256,768] = x[256,768] W^T; dgrad [256,768] = dy W; wgrad [768,768] = dy^T x.
  EXPECT_EQ(g[4].name, "attn.out.dgrad");
  EXPECT_EQ(g[5].name, "attn.out.wgrad");
  EXPECT_EQ(g[5].m, 768);
  EXPECT_EQ(g[5].k, 256);
  EXPECT_TRUE(g[5].trans_a);
}

TEST(LayerGemms, ZayaHasCcaProjectionsRouterAndExperts) {
  const ModelConfig c = load_model_config(kConfigs + "zaya1-base.json");
  const auto g = layer_gemms(c, 4096, 256, false);
  std::map<std::string, GemmShape> by_name;
  for (const auto& s : g) by_name[s.name] = s;
  EXPECT_EQ(by_name.at("attn.q.fwd").n, 1024);
  EXPECT_EQ(by_name.at("attn.k.fwd").n, 256);
  EXPECT_EQ(by_name.at("attn.v.fwd").n, 128);
  EXPECT_EQ(by_name.at("attn.out.fwd").k, 1024);
  EXPECT_EQ(by_name.at("router.down.fwd").n, 256);
  EXPECT_EQ(by_name.at("expert.up.fwd").m, 256);
  EXPECT_EQ(by_name.at("expert.up.fwd").n, 4096);
  EXPECT_EQ(by_name.at("expert.down.fwd").k, 2048);
}

}  // namespace
}  // namespace anvil::model
