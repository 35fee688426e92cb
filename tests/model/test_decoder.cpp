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
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/data/tokens.hpp"
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

// A safetensors file from a header text and `data_bytes` zero bytes of data.
std::string raw_safetensors(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = testing::TempDir() + "/" + name + ".safetensors";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file_atomic(path, bytes + header + std::string(data_bytes, '\0'));
  return path;
}

// A token file "anvil-tokens" v1 with the given header fields and body.
std::string raw_token_file(const std::string& name, uint32_t width, uint64_t vocab, uint64_t count,
                           const std::string& body) {
  std::string header(64, '\0');
  header.replace(0, 8, "ANVILTOK");
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) header[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(8, 1, 4);
  put(12, width, 4);
  put(16, vocab, 8);
  put(24, count, 8);
  const std::string path = testing::TempDir() + "/" + name + ".tok";
  write_file_atomic(path, header + body);
  return path;
}

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

// Distributed Muon's assignment: every muon-group matrix to exactly one rank
// (nothing else to any), no rank above the lightest by more than the largest
// single matrix (greedy, largest first), the same on every call.
TEST(Muon, OwnersCoverTheGroupOnceAndBalanceTheNewtonSchulzCost) {
  const ParamRegistry r = zaya_registry(preset("zaya-small"));
  for (int world : {1, 2, 3, 4, 7}) {
    const std::vector<int> owners = optim::muon_owners(r, world);
    ASSERT_EQ(owners.size(), r.specs().size());
    EXPECT_EQ(owners, optim::muon_owners(r, world));
    std::vector<double> load(static_cast<size_t>(world), 0.0);
    double largest = 0;
    for (size_t i = 0; i < owners.size(); ++i) {
      const auto& s = r.specs()[i];
      if (s.group != OptimizerGroup::muon) {
        EXPECT_EQ(owners[i], -1) << s.name;
        continue;
      }
      ASSERT_GE(owners[i], 0) << s.name;
      ASSERT_LT(owners[i], world) << s.name;
      const double rows = static_cast<double>(s.shape[0]), cols = s.numel / rows;
      const double cost = rows * cols * std::min(rows, cols);
      load[static_cast<size_t>(owners[i])] += cost;
      largest = std::max(largest, cost);
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, largest) << world << " ranks";
  }
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

// Under --ep K, Muon places the replicated matrices over all ranks as
// without EP (the same on every rank) and each rank's expert matrices over
// the ranks holding the same experts (rank % K alike): every expert matrix
// of a group gets one owner there, and the owners' loads stay balanced.
TEST(Muon, ExpertMatricesGoToTheRanksHoldingThem) {
  const ModelConfig c = preset("zaya-small");
  const int64_t E = c.n_experts;
  const int world = 4, K = 2;
  std::vector<ParamRegistry> regs;
  std::vector<std::vector<int>> owners;
  for (int r = 0; r < world; ++r) {
    regs.push_back(zaya_registry(c, {r % K * E / K, E / K}));
    owners.push_back(optim::muon_owners(regs.back(), world, K, r));
  }
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < regs[r].specs().size(); ++i) {
      const ParamSpec& s = regs[r].specs()[i];
      if (s.group != OptimizerGroup::muon) {
        EXPECT_EQ(owners[r][i], -1) << s.name;
      } else if (s.sharding == Sharding::expert) {
        ASSERT_GE(owners[r][i], 0) << s.name;
        EXPECT_EQ(owners[r][i] % K, r % K) << s.name << " on rank " << r;
        EXPECT_EQ(owners[r][i], owners[r % K][i]) << s.name << ": ranks of a group agree";
      } else {
        EXPECT_EQ(owners[r][i], owners[0][i]) << s.name << ": every rank agrees";
      }
    }
  }
  // Each rank's Newton-Schulz cost: the replicated and the expert matrices it owns.
  std::vector<double> load(world, 0.0);
  double largest = 0;
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < regs[r].specs().size(); ++i) {
      const ParamSpec& s = regs[r].specs()[i];
      if (owners[r][i] < 0) continue;
      const bool counted_here = s.sharding == Sharding::expert ? r < K : r == 0;
      if (!counted_here) continue;  // count each matrix once
      const double rows = static_cast<double>(s.shape[0]), cols = s.numel / rows;
      load[static_cast<size_t>(owners[r][i])] += rows * cols * std::min(rows, cols);
      largest = std::max(largest, rows * cols * std::min(rows, cols));
    }
  }
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, 2 * largest);
}

TEST(Muon, NewtonSchulzOrthogonalisesAndIsTransposeSymmetric) {
  const int64_t m = 12, n = 40;
  std::vector<float> g(m * n), gt(n * m), out(m * n), out_t(n * m);
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  for (auto& v : g) v = normal(gen);  // well conditioned (a Gaussian 12 x 40)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) gt[j * m + i] = g[i * n + j];
  std::vector<float> x(m * n), y(m * n), a(m * m), b(m * m);
  optim::newton_schulz(out.data(), g.data(), m, n, 5, x.data(), y.data(), a.data(), b.data());
  optim::newton_schulz(out_t.data(), gt.data(), n, m, 5, x.data(), y.data(), a.data(), b.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(out[i * n + j], out_t[j * m + i], 1e-5);
  // Rows come out near-orthonormal: the quintic iteration puts singular values in ~[0.7, 1.2].
  for (int64_t i = 0; i < m; ++i) {
    double d = 0;
    for (int64_t j = 0; j < n; ++j) d += static_cast<double>(out[i * n + j]) * out[i * n + j];
    EXPECT_GT(d, 0.4);
    EXPECT_LT(d, 1.6);
  }
}

// Same-shape matrices (ZAYA1's experts) are orthogonalised one per thread
// on single-threaded GEMMs; a matrix of its own shape alone on every thread.
// Each matrix's result must not depend on the threads or on how the ranks
// split the matrices: 1 rank on 1 or 2 threads and 2 ranks (their owned
// matrices put together) give the same bits, and each batched matrix equals
// momentum + Newton-Schulz + decay done by hand. The same holds for the bf16
// iteration (ns_bf16), on whichever bf16 path this process runs.
void expect_batched_muon_same_bits_on_any_layout(bool ns_bf16) {
  ParamRegistry r;
  for (int e = 0; e < 5; ++e)
    r.add("model.layers.1.experts." + std::to_string(e) + ".fc1.weight", {48, 24}, Init::normal,
          0.02f, true, OptimizerGroup::muon);
  r.add("model.layers.0.o_proj.weight", {40, 32}, Init::normal, 0.02f, true, OptimizerGroup::muon);
  r.add("model.final_norm.weight", {24}, Init::ones);
  std::vector<float> p0(static_cast<size_t>(r.total())), g(p0.size());
  r.initialize(p0.data(), 3);
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (auto& v : g) v = normal(gen);
  optim::MuonConfig cfg;
  cfg.ns_bf16 = ns_bf16;
  auto run = [&](int world, int threads) {
    std::vector<float> out = p0;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<float> p = p0;
      optim::Muon m(r, cfg, rank, world);
      m.update(p.data(), g.data(), 0.01f, 0.5f);
      m.update(p.data(), g.data(), 0.01f, 0.5f);  // momentum carried over
      for (size_t i = 0; i < r.specs().size(); ++i) {
        if (m.owners()[i] != rank) continue;
        const auto& s = r.specs()[i];
        std::copy(p.begin() + s.offset, p.begin() + s.offset + s.numel, out.begin() + s.offset);
      }
    }
    omp_set_num_threads(saved);
    return out;
  };
  const auto want = run(1, 1);
  EXPECT_EQ(run(1, 2), want);
  EXPECT_EQ(run(2, 1), want);
  EXPECT_EQ(run(2, 2), want);
  optim::Muon m(r, cfg);
  for (size_t i = 0; i < r.specs().size(); ++i)
    EXPECT_EQ(m.batched()[i] != 0, r.specs()[i].name.find("experts") != std::string::npos)
        << r.specs()[i].name;
  // By hand for expert 2: momentum buf = g/2 then mu buf + g/2, Nesterov.
  const auto& s = r.get("model.layers.1.experts.2.fc1.weight");
  std::vector<float> u(s.numel), x(s.numel), y(s.numel), a(24 * 24), b(24 * 24), p(s.numel);
  std::vector<bf16> xb(s.numel), ab(24 * 24);
  std::copy(p0.begin() + s.offset, p0.begin() + s.offset + s.numel, p.begin());
  std::vector<float> buf(s.numel, 0.0f);
  for (int step = 0; step < 2; ++step) {
    for (int64_t i = 0; i < s.numel; ++i) {
      const float gi = g[s.offset + i] * 0.5f;
      buf[i] = cfg.momentum * buf[i] + gi;
      u[i] = gi + cfg.momentum * buf[i];
    }
    if (ns_bf16) {
      optim::newton_schulz_bf16(u.data(), u.data(), 48, 24, cfg.ns_steps, x.data(), y.data(),
                                a.data(), b.data(), xb.data(), ab.data(),
                                device::GemmBackend::reference);
    } else {
      optim::newton_schulz(u.data(), u.data(), 48, 24, cfg.ns_steps, x.data(), y.data(), a.data(),
                           b.data(), device::GemmBackend::reference);
    }
    const float lr = 0.01f, scale = 0.2f * std::sqrt(48.0f), decay = 1.0f - lr * cfg.weight_decay;
    for (int64_t i = 0; i < s.numel; ++i) p[i] = p[i] * decay - lr * scale * u[i];
  }
  if (!ns_bf16) {
    for (int64_t i = 0; i < s.numel; ++i) EXPECT_NEAR(want[s.offset + i], p[i], 1e-6) << i;
    return;
  }
  // bf16: a GEMM's fp32 sum one ulp off the double reference can round an
  // iterate to the neighbouring bf16 value, and Newton-Schulz carries that
  // on; so the two updates (p - p0) are compared in norm.
  double num = 0, den = 0;
  for (int64_t i = 0; i < s.numel; ++i) {
    const double step = static_cast<double>(p[i]) - p0[s.offset + i];
    num += (want[s.offset + i] - static_cast<double>(p[i])) * (want[s.offset + i] - p[i]);
    den += step * step;
  }
  EXPECT_LT(std::sqrt(num / den), 0.01);
}

TEST(Muon, BatchedSameShapeMatricesGiveTheSameBitsOnAnyLayout) {
  expect_batched_muon_same_bits_on_any_layout(false);
}

TEST(Muon, BatchedBf16NewtonSchulzGivesTheSameBitsOnAnyLayout) {
  expect_batched_muon_same_bits_on_any_layout(true);
}

TEST(Muon, NewtonSchulzInBf16StaysCloseToFp32) {
  // A 64 x 96 Gaussian: the bf16 iteration rounds each GEMM's inputs to 8
  // mantissa bits; the iterate stays fp32, so it ends within a few bf16 ulps.
  const int64_t m = 64, n = 96;
  std::vector<float> g(m * n), want(m * n), got(m * n);
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  for (auto& v : g) v = normal(gen);
  std::vector<float> x(m * n), y(m * n), a(m * m), b(m * m);
  std::vector<bf16> xb(m * n), ab(m * m);
  optim::newton_schulz(want.data(), g.data(), m, n, 5, x.data(), y.data(), a.data(), b.data());
  optim::newton_schulz_bf16(got.data(), g.data(), m, n, 5, x.data(), y.data(), a.data(), b.data(),
                            xb.data(), ab.data());
  double num = 0, den = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
  EXPECT_GT(std::sqrt(num / den), 0.0);  // it did run in bf16
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

TEST(Safetensors, RoundTripsAndNamesTheFileOnBadInput) {
  const std::string path = testing::TempDir() + "/t.safetensors";
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  ckpt::write_safetensors(path, {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"k", "v"}});
  const auto f = ckpt::read_safetensors(path);
  EXPECT_EQ(f.get("a", {2, 3}).data, a);
  EXPECT_EQ(f.get("b", {1}).data, b);
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_THROW(f.get("a", {3, 2}), InputError);
  EXPECT_THROW(f.get("c", {1}), InputError);
  write_file_atomic(path, std::string("\x05\0\0\0\0\0\0\0{bad}", 13));
  EXPECT_THROW(ckpt::read_safetensors(path), InputError);
}

TEST(Safetensors, EachMalformedHeaderIsOneLineNamingTheFileAndTensor) {
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  auto check = [&](const std::string& name, const std::string& header, size_t data,
                   std::vector<std::string> parts) {
    const std::string path = raw_safetensors(name, header, data);
    parts.insert(parts.begin(), path + ": ");
    expect_input_error([&] { ckpt::read_safetensors(path); }, parts);
  };
  // Well formed, both dtypes: the checks below are what rejects the others.
  const auto good = ckpt::read_safetensors(raw_safetensors(
      "st_good",
      "{" + entry("a", "F32", "[2,3]", 0, 24) + "," + entry("b", "BF16", "[3]", 24, 30) +
          ",\"__metadata__\":{\"format\":\"pt\"}}",
      30));
  EXPECT_EQ(good.tensors.at("b").data.size(), 3u);
  EXPECT_EQ(good.metadata.at("format"), "pt");

  EXPECT_EQ(tensor::checked_numel({int64_t{1} << 62, 4}), -1);
  EXPECT_EQ(tensor::checked_numel({0, -1}), -1);
  EXPECT_EQ(tensor::checked_numel({int64_t{1} << 62, 0}), 0);
  EXPECT_THROW(tensor::numel({3, -1}), std::invalid_argument);
  check("st_negative", "{" + entry("a", "F32", "[-1,4]", 0, 16) + "}", 16,
        {"tensor a: ", "dimension -1 is negative"});
  // 2^62 x 4 elements wrap to 0 in int64 (and so to 0 bytes): refused, not read as empty.
  check("st_numel_overflow", "{" + entry("a", "F32", "[4611686018427387904,4]", 0, 0) + "}", 0,
        {"tensor a: ", "overflows"});
  // 2^62 elements fit, 2^64 bytes of F32 do not.
  check("st_bytes_overflow", "{" + entry("a", "F32", "[4611686018427387904]", 0, 0) + "}", 0,
        {"tensor a: ", "overflows"});
  check("st_huge_dim", "{" + entry("a", "F32", "[18446744073709551615]", 0, 0) + "}", 0,
        {"tensor a: ", "dimension 18446744073709551615"});
  check("st_float_dim", "{" + entry("a", "F32", "[2.5]", 0, 8) + "}", 8,
        {"tensor a: ", "dimension 2.5"});
  check("st_meta_number", "{" + entry("a", "F32", "[1]", 0, 4) + ",\"__metadata__\":{\"step\":5}}",
        4, {"__metadata__: step is 5 (expected a string)"});
  check("st_meta_array", "{\"__metadata__\":[1]}", 0,
        {"__metadata__ is [1] (expected an object of strings)"});
  check("st_duplicate",
        "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[2]", 4, 12) + "}", 12,
        {"tensor a: named twice"});
  check("st_overlap",
        "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 8, 24) + "}", 24,
        {"tensor b: data_offsets [8, 24] overlap tensor a's [0, 16]"});
  check("st_same_range",
        "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 0, 16) + "}", 16,
        {"tensor b: ", "overlap tensor a's [0, 16]"});
  check("st_reversed", "{" + entry("a", "F32", "[0]", 16, 0) + "}", 16,
        {"tensor a: data_offsets [16, 0]: end before begin"});
  check("st_past_end", "{" + entry("a", "F32", "[4]", 0, 16) + "}", 12,
        {"tensor a: data_offsets [0, 16]: past the end", "expected end <= 12"});
  check("st_f32_size", "{" + entry("a", "F32", "[2,3]", 0, 12) + "}", 12,
        {"tensor a: data_offsets [0, 12]: 12 bytes (expected 24 for F32 [2,3])"});
  check("st_bf16_size", "{" + entry("a", "BF16", "[2,3]", 0, 24) + "}", 24,
        {"tensor a: ", "24 bytes (expected 12 for BF16 [2,3])"});
  check("st_dtype", "{" + entry("a", "F16", "[1]", 0, 2) + "}", 2,
        {"tensor a: dtype F16 (expected F32 or BF16)"});
  check("st_negative_offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
        4, {"tensor a: data_offsets [-4,0]"});
  check("st_not_object", "[1,2]", 0, {"header is [1,2], expected an object"});
}

TEST(TokenFile, RoundTripsAndTextIsReadAsBytes) {
  const std::string dir = testing::TempDir();
  data::write_token_file(dir + "/t.tok", {0, 5, 65535, 7}, 65536);
  data::TokenData t(dir + "/t.tok");
  EXPECT_EQ(t.size(), 4);
  EXPECT_EQ(t[2], 65535);
  EXPECT_EQ(t.tokenizer(), "file");
  data::write_token_file(dir + "/w.tok", {70000, 1}, 100000);  // needs 4-byte tokens
  EXPECT_EQ(data::TokenData(dir + "/w.tok")[0], 70000);
  write_file_atomic(dir + "/x.txt", "Hi!");
  data::TokenData text(dir + "/x.txt");
  EXPECT_EQ(text.tokenizer(), "bytes");
  EXPECT_EQ(text.size(), 3);
  EXPECT_EQ(text[1], 'i');
  std::string broken(64 + 3, '\0');
  broken.replace(0, 8, "ANVILTOK");
  broken[8] = 1;
  broken[12] = 2;
  broken[24] = 2;  // says 2 tokens, holds 1.5
  write_file_atomic(dir + "/b.tok", broken);
  EXPECT_THROW(data::TokenData(dir + "/b.tok"), InputError);
}

TEST(TokenFile, EveryIdIsCheckedAgainstTheVocabularyWhenOpened) {
  auto u16 = [](std::vector<uint16_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
  };
  auto u32 = [](std::vector<uint32_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  auto check = [](const std::string& path, const std::vector<std::string>& parts) {
    std::vector<std::string> all = {path + ": "};
    all.insert(all.end(), parts.begin(), parts.end());
    expect_input_error([&] { data::TokenData t(path); }, all);
  };
  // Long enough for the vectorised pass to run whole vectors; the first bad
  // id is reported, not the largest.
  std::vector<uint16_t> ids(1000, 7);
  ids[999] = 255;
  EXPECT_EQ(data::TokenData(raw_token_file("ok16", 2, 256, ids.size(), u16(ids)))[999], 255);
  ids[613] = 256;
  ids[870] = 65535;
  check(raw_token_file("bad16", 2, 256, ids.size(), u16(ids)),
        {"token 256 at position 613 is outside the header's vocabulary [0, 256)"});
  ids.assign(1000, 7);
  ids[0] = 300;
  check(raw_token_file("bad16_first", 2, 256, ids.size(), u16(ids)), {"token 300 at position 0"});
  std::vector<uint32_t> wide(333, 99999);
  wide[332] = 100000;
  check(raw_token_file("bad32", 4, 100000, wide.size(), u32(wide)),
        {"token 100000 at position 332", "[0, 100000)"});
  wide[332] = 4000000000u;  // past int32: would read back as a negative id
  check(raw_token_file("bad32_sign", 4, 100000, wide.size(), u32(wide)),
        {"token 4000000000 at position 332"});
  check(raw_token_file("vocab0", 2, 0, 1, u16({0})), {"vocabulary 0 (expected 1..2147483647)"});
  check(raw_token_file("vocab_huge", 4, uint64_t{1} << 40, 1, u32({0})),
        {"vocabulary 1099511627776"});
  // 2^63 tokens of 2 bytes wrap to 0 bytes: refused, not read as empty.
  check(raw_token_file("count_wrap", 2, 256, uint64_t{1} << 63, ""),
        {"header says 9223372036854775808 tokens"});
}

TEST(Schedule, WarmupCosineAndWsd) {
  optim::Schedule s;
  s.lr = 1.0;
  s.min_lr_ratio = 0.1;
  s.warmup = 10;
  s.total = 110;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  s.kind = "wsd";
  s.decay_fraction = 0.2;  // decay over the last 22 steps
  EXPECT_DOUBLE_EQ(s.at(87), 1.0);
  EXPECT_NEAR(s.at(109), 0.1, 1e-12);
  s.kind = "linear";
  EXPECT_THROW(optim::validate(s, "--schedule"), InputError);
}

TEST(Clipping, CoefficientIsTorchsAndAdamWAppliesIt) {
  std::vector<float> g = {3, 4};
  EXPECT_DOUBLE_EQ(optim::global_norm(g.data(), 2), 5.0);
  EXPECT_NEAR(optim::clip_coefficient(5.0, 1.0), 0.2, 1e-7);
  EXPECT_EQ(optim::clip_coefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(optim::clip_coefficient(5.0, 0.0), 1.0f);  // off
  // One AdamW step with scaled gradients equals one with pre-scaled ones.
  ParamRegistry r;
  r.add("w", {2}, Init::zeros, 0.0f, true);
  optim::AdamW a(r, {}), b(r, {});
  std::vector<float> pa = {1, 1}, pb = {1, 1}, scaled = {0.6f, 0.8f};
  a.update(pa.data(), g.data(), 0.1f, 1, 0.2f);
  b.update(pb.data(), scaled.data(), 0.1f, 1);
  EXPECT_EQ(pa, pb);
}

}  // namespace
}  // namespace anvil::model
