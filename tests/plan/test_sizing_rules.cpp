// The sizing rules on shapes whose answer can be checked by hand.
#include <gtest/gtest.h>

#include "anvil/model/config.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/plan/sizing_rules.hpp"

namespace anvil::plan {
namespace {

const std::string kSource = ANVIL_SOURCE_DIR;

HwProfile mi300x() {
  return load_hw_profile(kSource + "/profiles/mi300x.json");
}

TEST(SizingRules, ADimensionNotAMultipleOf64WarnsInBf16OnAGpu) {
  const HwProfile hw = mi300x();
  EXPECT_EQ(alignment_elements(hw, "bf16"), 64);
  EXPECT_EQ(alignment_elements(hw, "f32"), 32);
  const RuleResult bad = check_alignment("d_model", 1000, hw, "bf16");
  EXPECT_FALSE(bad.pass);
  EXPECT_EQ(bad.suggestion, "d_model = 1024");
  EXPECT_NEAR(bad.loss, 1.0 - 1000.0 / 1024.0, 1e-12);  // padded to 16 x 64
  EXPECT_TRUE(check_alignment("d_model", 1024, hw, "bf16").pass);
  EXPECT_TRUE(check_alignment("d_model", 1056, hw, "f32").pass);    // 33 x 32
  EXPECT_FALSE(check_alignment("d_model", 1056, hw, "bf16").pass);  // not 64
}

TEST(SizingRules, ATileCountJustAboveAMultipleOf304WarnsWithTheWaveEfficiency) {
  const HwProfile hw = mi300x();
  ASSERT_EQ(hw.compute_units, 304);
  // 305 row tiles x 1 column tile of 256 x 128: two waves, the second with one tile.
  const int64_t m = 305 * kGpuTileM, n = kGpuTileN, k = 4096;
  const RuleResult r = check_gemm_quantization("g", m, n, k, hw, "bf16", true);
  EXPECT_FALSE(r.pass);
  EXPECT_NEAR(r.loss, 1.0 - 305.0 / 608.0, 1e-12);
  EXPECT_NE(r.detail.find("305 tiles"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find("2 wave(s)"), std::string::npos) << r.detail;
  // Exactly 304 tiles fill one wave; 608 fill two.
  EXPECT_TRUE(check_gemm_quantization("g", 304 * kGpuTileM, n, k, hw, "bf16", true).pass);
  EXPECT_TRUE(check_gemm_quantization("g", 608 * kGpuTileM, n, k, hw, "bf16", true).pass);
  // The same GEMM on an H100's 132 SMs: 305 = 2 x 132 + 41 -> 3 waves.
  HwProfile h100 = load_hw_profile(kSource + "/profiles/h100-sxm.json");
  ASSERT_EQ(h100.compute_units, 132);
  const GemmPrice g = price_gemm(h100, "bf16", m, n, k);
  EXPECT_EQ(g.waves, 3);
  EXPECT_NEAR(g.wave, 305.0 / 396.0, 1e-12);
}

TEST(SizingRules, AnOutputJustAboveATileMultipleWastesMostOfTheLastTile) {
  const HwProfile hw = mi300x();
  const RuleResult r = check_gemm_quantization("g", 4096, kGpuTileN + 1, 4096, hw, "bf16", false);
  EXPECT_FALSE(r.pass);
  EXPECT_NEAR(r.loss, 1.0 - (kGpuTileN + 1.0) / (2.0 * kGpuTileN), 1e-12);
  EXPECT_TRUE(check_gemm_quantization("g", 4096, 2 * kGpuTileN, 4096, hw, "bf16", false).pass);
}

TEST(SizingRules, ConfigChecksHeadDimensionVocabularyAndExpertWidth) {
  const HwProfile hw = mi300x();
  model::ModelConfig c = model::load_model_config(kSource + "/configs/gpt2-124m.json");
  Layout l;
  l.micro_batch = 4;
  l.seq = 1024;
  auto find = [](const std::vector<RuleResult>& rules, const std::string& rule) {
    for (const auto& r : rules)
      if (r.rule == rule) return r;
    return RuleResult{};
  };
  auto rules = check_sizing_rules(c, hw, l);
  EXPECT_TRUE(find(rules, "head dimension").pass);
  EXPECT_TRUE(find(rules, "vocabulary padding").pass);  // 50304 = 786 x 64
  c.vocab_size = 50257;
  c.head_dim = 80;
  rules = check_sizing_rules(c, hw, l);
  EXPECT_FALSE(find(rules, "vocabulary padding").pass);
  EXPECT_EQ(find(rules, "vocabulary padding").suggestion, "vocab_size = 50304");
  EXPECT_FALSE(find(rules, "head dimension").pass);

  // 64 experts at one 1024-token sequence: 16 tokens per expert, memory bound.
  model::ModelConfig moe = model::load_model_config(kSource + "/configs/zaya1-base.json");
  moe.n_experts = 64;
  moe.expert_ffn_hidden = 512;
  l.micro_batch = 1;
  rules = check_sizing_rules(moe, hw, l);
  const RuleResult expert = find(rules, "expert width");
  EXPECT_FALSE(expert.pass) << expert.detail;
  EXPECT_NE(expert.detail.find("16 tokens per expert"), std::string::npos) << expert.detail;
  EXPECT_NE(expert.detail.find("memory bound"), std::string::npos) << expert.detail;
}

TEST(SizingRules, RecommendKeepsCcaAtTwoKeyValueHeads) {
  const HwProfile hw = mi300x();
  const model::ModelConfig c = model::load_model_config(kSource + "/configs/zaya1-base.json");
  PlanOptions o;
  o.layout.seq = 4096;
  o.layout.devices_per_node = 8;
  o.layout.global_batch = 8;
  for (const auto& cand : recommend(c, hw, o, 0.05)) {
    EXPECT_EQ(cand.config.n_kv_heads, 2) << cand.change;
  }
}

TEST(SizingRules, RecommendStaysWithinTheBudgetBestFirst) {
  const HwProfile hw = mi300x();
  model::ModelConfig c = model::load_model_config(kSource + "/configs/gpt2-124m.json");
  c.d_model = 1000;  // misaligned on purpose
  c.ffn_hidden = 4000;
  PlanOptions o;
  o.layout.micro_batch = 4;
  o.layout.seq = 1024;
  o.layout.global_batch = 4;
  const auto cands = recommend(c, hw, o, 0.05);
  ASSERT_GT(cands.size(), 3u);
  const double budget = static_cast<double>(model::count_parameters(c).non_embedding_total);
  bool given = false;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (cands[i].change == "as given") {
      given = true;
      continue;
    }
    EXPECT_LE(std::abs(cands[i].non_embedding_total / budget - 1), 0.05) << cands[i].change;
    if (i > 0) {
      EXPECT_GE(cands[i - 1].prediction.tokens_per_s, cands[i].prediction.tokens_per_s);
    }
  }
  EXPECT_TRUE(given);
  // The best candidate is aligned (the misaligned input is not the winner).
  EXPECT_EQ(cands.front().config.d_model % 64, 0);
  EXPECT_NE(cands.front().change, "as given");
}

}  // namespace
}  // namespace anvil::plan
