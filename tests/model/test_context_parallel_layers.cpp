// One layer of each kind under context parallelism against the whole
// sequence in one piece: the CCA layer (its convolution and value-shift
// halos, RoPE at global positions, attention over the gathered K/V) and a
// one-layer dense decoder of each position kind (gpt2-tiny: learned
// positions, llama-tiny: RoPE + GQA). C ranks are threads here
// (support/thread_context_group.hpp); each holds chunks r and 2C-1-r of
// every row. Outputs, the input gradients (the CCA layer's dx, the
// decoder's embedding rows) and every weight gradient summed over the ranks
// equal the one-piece ones within 1e-6 relative (to the tensor's largest).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "anvil/model/cca_layer.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "support/thread_context_group.hpp"

namespace anvil::model {
namespace {

using test_support::run_ranks;
using test_support::ThreadContextGroup;

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 0.4f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(gen);
  return v;
}

// Largest |got - want| relative to want's largest entry.
double relative(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return err / scale;
}

// Rank r's rows of full [B][T][width] in its chunk order, and back.
template <typename V>
V local_rows(const V& full, const ContextLayout& L, int64_t B, int64_t width) {
  V out(static_cast<size_t>(B * L.local() * width));
  L.take_local(full.data(), out.data(), B, width);
  return out;
}

void put_rows(std::vector<float>& full, const std::vector<float>& local, const ContextLayout& L,
              int64_t B, int64_t width) {
  const int64_t S = L.chunk(), Tl = L.local();
  for (int64_t b = 0; b < B; ++b)
    for (int p = 0; p < 2; ++p)
      std::copy_n(&local[static_cast<size_t>((b * Tl + p * S) * width)], S * width,
                  &full[static_cast<size_t>((b * L.seq + L.start(p)) * width)]);
}

TEST(ContextParallelLayers, CcaLayerMatchesTheWholeSequenceWithHaloGradients) {
  CcaShape s;
  s.hidden = 12;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.rotary_dim = 4;
  const int64_t B = 2, T = 24, H = s.hidden, C = s.channels(), d = s.head_dim;
  std::vector<std::vector<float>> w = {
      random_floats(C * H, 1), random_floats(d * H, 2), random_floats(d * H, 3),
      random_floats(C * 2, 4), random_floats(C, 5),     random_floats(C * d * 2, 6),
      random_floats(C, 7),     random_floats(2, 8),     random_floats(H * s.q_latent(), 9)};
  auto params = [](std::vector<std::vector<float>>& v) {
    return CcaParams{v[0].data(), v[1].data(), v[2].data(), v[3].data(), v[4].data(),
                     v[5].data(), v[6].data(), v[7].data(), v[8].data()};
  };
  auto zeros_like = [&] {
    std::vector<std::vector<float>> g;
    for (const auto& v : w) g.emplace_back(v.size(), 0.0f);
    return g;
  };
  const auto x = random_floats(B * T * H, 10), dout = random_floats(B * T * H, 11);
  CcaLayer whole(s, B, T);
  whole.allocate();
  std::vector<float> out(B * T * H), dx(B * T * H, 0.0f);
  auto gw = zeros_like();
  whole.forward(out.data(), x.data(), params(w));
  whole.backward(dx.data(), params(gw), dout.data(), x.data(), params(w));
  for (const int ranks : {2, 3}) {
    std::vector<float> c_out(out.size()), c_dx(dx.size());
    std::vector<std::vector<std::vector<float>>> c_gw(static_cast<size_t>(ranks));
    run_ranks(ranks, [&](ThreadContextGroup& group) {
      ContextParallel cp(&group, B, T);
      const ContextLayout& L = cp.layout();
      tensor::Arena scratch =
          carve_arena("cp", [&](Carver& c) { cp.carve(c, 2 * s.kv_heads * s.head_dim); });
      CcaLayer layer(s, B, L.local(), &cp);
      layer.allocate();
      const auto lx = local_rows(x, L, B, H), ldout = local_rows(dout, L, B, H);
      std::vector<float> lout(lx.size()), ldx(lx.size(), 0.0f);
      auto w_here = w;
      auto g = zeros_like();
      layer.forward(lout.data(), lx.data(), params(w_here));
      layer.backward(ldx.data(), params(g), ldout.data(), lx.data(), params(w_here));
      put_rows(c_out, lout, L, B, H);
      put_rows(c_dx, ldx, L, B, H);
      c_gw[static_cast<size_t>(L.rank)] = g;
    });
    const std::string what = std::to_string(ranks) + " ranks";
    EXPECT_LE(relative(c_out, out), 1e-6) << what << ": out";
    EXPECT_LE(relative(c_dx, dx), 1e-6) << what << ": dx (with the halo gradients)";
    const char* names[] = {"wqk",     "wv1",     "wv2",  "conv0_w", "conv0_b",
                           "conv1_w", "conv1_b", "temp", "wo"};
    for (size_t i = 0; i < w.size(); ++i) {
      std::vector<float> sum(w[i].size(), 0.0f);
      for (const auto& g : c_gw)
        for (size_t j = 0; j < sum.size(); ++j) sum[j] += g[i][j];
      EXPECT_LE(relative(sum, gw[i]), 1e-6) << what << ": " << names[i];
    }
  }
}

void expect_decoder_matches(const std::string& config_name) {
  ModelConfig c = load_model_config(
      std::string(ANVIL_SOURCE_DIR) + "/tests/configs/" + config_name + ".json",
      {"n_layers=1", "vocab_size=64"});
  const int64_t B = 2, T = 24;
  std::mt19937 gen(5);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % 64);
  for (auto& t : targets) t = static_cast<int32_t>(gen() % 64);
  targets[3] = -1;  // an unscored position
  Decoder whole(c, B, T, true);
  whole.registry().initialize(whole.params(), 3);
  const std::vector<float> init(whole.params(), whole.params() + whole.registry().total());
  whole.zero_grads();
  int64_t scored = 0;
  const double loss = whole.forward_backward(tokens.data(), targets.data(), B, T, 1.0f, &scored);
  const std::vector<float> grads(whole.grads(), whole.grads() + whole.registry().total());
  double grad_scale = 0;
  for (const float g : grads) grad_scale = std::max(grad_scale, std::abs(static_cast<double>(g)));
  for (const int ranks : {2, 3}) {
    std::vector<double> losses(static_cast<size_t>(ranks));
    std::vector<int64_t> counts(static_cast<size_t>(ranks));
    std::vector<std::vector<float>> rank_grads(static_cast<size_t>(ranks));
    run_ranks(ranks, [&](ThreadContextGroup& group) {
      Decoder model(c, B, T, true, Precision::fp32, &group);
      std::copy(init.begin(), init.end(), model.params());
      ContextLayout L;
      L.size = ranks;
      L.rank = group.rank();
      L.seq = T;
      const auto lt = local_rows(tokens, L, B, 1), lg = local_rows(targets, L, B, 1);
      model.zero_grads();
      int64_t n = 0;
      losses[static_cast<size_t>(L.rank)] =
          model.forward_backward(lt.data(), lg.data(), B, L.local(), 1.0f, &n);
      counts[static_cast<size_t>(L.rank)] = n;
      rank_grads[static_cast<size_t>(L.rank)].assign(model.grads(),
                                                     model.grads() + model.registry().total());
    });
    const std::string what = config_name + " on " + std::to_string(ranks) + " ranks";
    double got_loss = 0;
    int64_t got_scored = 0;
    for (int r = 0; r < ranks; ++r) {
      got_loss += losses[static_cast<size_t>(r)];
      got_scored += counts[static_cast<size_t>(r)];
    }
    EXPECT_EQ(got_scored, scored) << what;
    EXPECT_NEAR(got_loss, loss, 1e-6 * std::abs(loss)) << what;
    for (const auto& spec : whole.registry().specs()) {
      const auto n = static_cast<size_t>(spec.numel);
      const auto off = static_cast<size_t>(spec.offset);
      std::vector<float> want(grads.begin() + off, grads.begin() + off + n), sum(n, 0.0f);
      for (const auto& g : rank_grads)
        for (size_t j = 0; j < n; ++j) sum[j] += g[off + j];
      if (spec.name.ends_with("k_proj.bias")) {
        // Exactly zero (softmax ignores a shift shared by all keys): both are
        // rounding noise, held against the whole gradient's scale instead.
        double diff = 0;
        for (size_t j = 0; j < n; ++j)
          diff = std::max(diff, std::abs(static_cast<double>(sum[j]) - want[j]));
        EXPECT_LE(diff, 1e-6 * grad_scale)
            << what << ": " << spec.name;
        continue;
      }
      EXPECT_LE(relative(sum, want), 1e-6) << what << ": " << spec.name;
    }
  }
}

TEST(ContextParallelLayers, DenseDecoderLayerMatchesTheWholeSequence) {
  expect_decoder_matches("gpt2-tiny");   // learned positions
  expect_decoder_matches("llama-tiny");  // RoPE, GQA
}

}  // namespace
}  // namespace anvil::model
