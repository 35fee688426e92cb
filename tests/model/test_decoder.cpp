// The dense decoder and the model registry: Hugging Face names and counts,
// the Muon group, expert ranges, fused projections, init by name, arenas that
// are exactly the plan, refused inputs, and config validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <vector>

#include <omp.h>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/param_count.hpp"
#include "anvil/model/zaya_model.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/muon.hpp"
#include "anvil/tensor/tensor.hpp"
#include "support/input_error.hpp"

namespace anvil::model {
namespace {

ModelConfig preset(const std::string& name, std::vector<std::string> overrides = {}) {
  return load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/" + name + ".json", overrides);
}

using test_support::expect_input_error;

TEST(Registry, Gpt2PresetHasHuggingFaceNamesAndTheGpt2ParameterCount) {
  const auto r = decoder_registry(preset("gpt2-124m"));
  // GPT-2 small with a 50304 vocabulary and 1024 positions: 124,475,904 parameters.
  EXPECT_EQ(r.total(), 124475904);
  EXPECT_EQ(r.get("model.layers.3.self_attn.q_proj.weight").shape,
            (std::vector<int64_t>{768, 768}));
  EXPECT_TRUE(r.get("model.layers.3.self_attn.q_proj.weight").weight_decay);
  EXPECT_FALSE(r.get("model.layers.3.self_attn.q_proj.bias").weight_decay);
  EXPECT_EQ(r.find("lm_head.weight"), nullptr);  // tied
  EXPECT_EQ(to_string(r.get("model.norm.weight").sharding), "replicated");
}

TEST(ParamCount, Zaya1BaseMatchesThePublishedCountsExactly) {
  // docs/zaya1-spec.md section 1 (published: 8.3B total, 760M active).
  const auto n = count_parameters(preset("zaya1-base"));
  EXPECT_EQ(n.non_embedding_total, 8303355728);
  EXPECT_EQ(n.non_embedding_active, 753608528);
  EXPECT_EQ(n.embedding, 537133056);
}

TEST(ParamCount, DenseCountsAreTheRegistrys) {
  const auto c = preset("gpt2-124m");
  const auto n = count_parameters(c);
  EXPECT_EQ(n.total(), decoder_registry(c).total());
  EXPECT_EQ(n.embedding, 50304 * 768 + 1024 * 768);  // tokens + positions
  EXPECT_EQ(n.active(), n.total());
  const auto untied = count_parameters(preset("llama-style"));
  EXPECT_EQ(untied.embedding, 2 * 50304 * 768);  // embedding + lm head
}

TEST(Registry, MuonGroupIsTheBlocksWeightMatrices) {
  const auto r = decoder_registry(preset("gpt2-124m"));
  int64_t muon = 0;
  for (const auto& s : r.specs()) {
    const bool block_matrix = s.shape.size() == 2 && s.name.rfind("model.layers.", 0) == 0;
    EXPECT_EQ(s.group == OptimizerGroup::muon, block_matrix) << s.name;
    muon += s.group == OptimizerGroup::muon;
  }
  EXPECT_EQ(muon, 12 * 6);  // q, k, v, o, up, down per layer
  EXPECT_EQ(r.get("model.embed_tokens.weight").group, OptimizerGroup::adamw);
}

// Expert parallelism: a rank's registry holds its E/K experts of every MoE
// layer under their global names, laid out like every other rank's (the same
// offsets and sizes, so buckets and ZeRO blocks line up across ranks); the K
// registries' experts together are the whole model's, once each.
TEST(Registry, ExpertRangesSplitTheExpertsAndKeepTheLayoutAlike) {
  const ModelConfig c = preset("zaya-small");
  const ParamRegistry all = zaya_registry(c);
  const int64_t E = c.n_experts;
  for (int64_t K : {2, 4}) {
    std::vector<ParamRegistry> ranks;
    for (int64_t k = 0; k < K; ++k) ranks.push_back(zaya_registry(c, {k * E / K, E / K}));
    std::map<std::string, int> experts;
    for (const ParamRegistry& r : ranks) {
      ASSERT_EQ(r.specs().size(), ranks[0].specs().size());
      EXPECT_EQ(r.total(), ranks[0].total());
      for (size_t i = 0; i < r.specs().size(); ++i) {
        const ParamSpec &s = r.specs()[i], &s0 = ranks[0].specs()[i];
        EXPECT_EQ(s.offset, s0.offset) << s.name;
        EXPECT_EQ(s.shape, s0.shape) << s.name;
        EXPECT_EQ(s.sharding, s0.sharding) << s.name;
        ASSERT_NE(all.find(s.name), nullptr) << s.name;
        EXPECT_EQ(all.get(s.name).shape, s.shape) << s.name;
        if (s.sharding == Sharding::expert) {
          ++experts[s.name];
        } else {
          EXPECT_EQ(s.name, s0.name);
        }
      }
    }
    int64_t want = 0;
    for (const auto& s : all.specs()) {
      if (s.sharding != Sharding::expert) continue;
      ++want;
      EXPECT_EQ(experts[s.name], 1) << s.name << " with --ep " << K;
    }
    EXPECT_EQ(static_cast<int64_t>(experts.size()), want);
  }
  expect_input_error(
      [&] {
        zaya_registry(c, {E - 1, 2});
      },
      {"experts [", "are not a range of its"});
}

TEST(Registry, FusedProjectionsAreContiguous) {
  const auto r = decoder_registry(preset("llama-style"));
  const auto& q = r.get("model.layers.0.self_attn.q_proj.weight");
  const auto& k = r.get("model.layers.0.self_attn.k_proj.weight");
  const auto& v = r.get("model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(k.offset, q.offset + q.numel);
  EXPECT_EQ(v.offset, k.offset + k.numel);
  const auto& gate = r.get("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(r.get("model.layers.0.mlp.up_proj.weight").offset, gate.offset + gate.numel);
  EXPECT_NE(r.find("lm_head.weight"), nullptr);
  EXPECT_EQ(r.find("model.layers.0.self_attn.q_proj.bias"), nullptr);
}

TEST(Registry, InitDependsOnTheNameNotTheOrder) {
  ParamRegistry a, b;
  a.add("x", {4}, Init::normal, 1.0f);
  a.add("y", {4}, Init::normal, 1.0f);
  b.add("y", {4}, Init::normal, 1.0f);
  b.add("x", {4}, Init::normal, 1.0f);
  std::vector<float> pa(8), pb(8);
  a.initialize(pa.data(), 9);
  b.initialize(pb.data(), 9);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pa[i], pb[4 + i]);
    EXPECT_EQ(pa[4 + i], pb[i]);
  }
  EXPECT_THROW(a.add("x", {1}, Init::zeros), InputError);
}

TEST(Decoder, ArenasAreExactlyThePlan) {
  const auto c = preset("gpt2-124m", {"n_layers=2", "vocab_size=300", "seq_len=64"});
  Decoder d(c, 2, 64, true);
  const auto p = Decoder::plan_for(c, 2, 64, true);
  EXPECT_EQ(p.parameters, d.plan().parameters);
  EXPECT_GE(p.parameters, static_cast<size_t>(d.registry().total()) * 4);
  EXPECT_LT(p.parameters, static_cast<size_t>(d.registry().total()) * 4 + 64);
  EXPECT_EQ(Decoder::plan_for(c, 2, 64, false).gradients, 0u);
  EXPECT_LT(Decoder::plan_for(c, 2, 64, false).activations, p.activations);
}

TEST(Decoder, RejectsTokensOutsideTheVocabularyAndOversizedBatches) {
  const auto c = preset("gpt2-124m", {"n_layers=1", "vocab_size=50", "seq_len=8", "d_model=32",
                                      "n_heads=2", "n_kv_heads=2", "head_dim=16", "ffn_hidden=64"});
  Decoder d(c, 1, 8, true);
  std::vector<int32_t> tokens(8, 1), targets(8, 2);
  int64_t scored = 0;
  tokens[3] = 50;
  EXPECT_THROW(d.forward(tokens.data(), targets.data(), 1, 8, &scored), InputError);
  tokens[3] = 1;
  EXPECT_THROW(d.forward(tokens.data(), targets.data(), 2, 8, &scored), InputError);
  EXPECT_THROW(Decoder(c, 1, 9, true), InputError);
  // A target past the vocabulary never reaches logits[target] in the loss.
  targets[5] = 50;
  EXPECT_THROW(d.forward(tokens.data(), targets.data(), 1, 8, &scored), std::out_of_range);
  EXPECT_THROW(d.forward_backward(tokens.data(), targets.data(), 1, 8, 1.0f, &scored),
               std::out_of_range);
  targets[5] = -1;  // not scored
  d.forward(tokens.data(), targets.data(), 1, 8, &scored);
  EXPECT_EQ(scored, 7);
}

TEST(Decoder, ZayaLayersAreRefusedWithAClearError) {
  EXPECT_THROW(decoder_registry(preset("zaya1-base")), InputError);
}

TEST(Config, NewKeysAreValidated) {
  EXPECT_THROW(preset("llama-style", {"rotary_dim=7"}), InputError);
  EXPECT_THROW(preset("llama-style", {"rotary_dim=128"}), InputError);
  EXPECT_THROW(preset("llama-style", {"norm_eps=0"}), InputError);
  EXPECT_THROW(preset("gpt2-124m", {"bias=false"}), InputError);  // LayerNorm has a bias
  const auto c = preset("llama-style", {"rope_theta=500000"});
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(parse_model_config(model_config_to_json(c), "round trip").rope_theta, 500000.0);
}

}  // namespace
}  // namespace anvil::model
