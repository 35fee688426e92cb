// The optimizers: Muon's owners and Newton-Schulz (the same bits however
// the matrices are batched), the learning-rate schedules, and the gradient
// clip as torch computes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "anvil/kernels/layers.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/decoder.hpp"
#include "anvil/model/zaya_model.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/muon.hpp"
#include "anvil/optim/square_sum.hpp"
#include "support/device_adamw_check.hpp"
#include "support/device_muon_check.hpp"
#include "support/input_error.hpp"

namespace anvil::optim {
namespace {

using namespace anvil::model;  // registries and configs to optimize

ModelConfig preset(const std::string& name, std::vector<std::string> overrides = {}) {
  return load_model_config(std::string(ANVIL_SOURCE_DIR) + "/configs/" + name + ".json", overrides);
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

// symmetric_gram multiplies the lower triangle (OpenBLAS's ssyrk, or the
// blocks on and below the diagonal) and mirrors it: the same sum as a full
// GEMM, exactly symmetric, for 1 to 4 strips (r = 100, 300, 520: edge tiles
// in the mirror too) and a beta that scales a symmetric old value.
TEST(Muon, SymmetricGramMatchesTheFullProduct) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (const int64_t r : {100, 300, 520}) {
    const int64_t c = 136;
    std::vector<float> x(static_cast<size_t>(r * c)), old(static_cast<size_t>(r * r));
    for (auto& v : x) v = normal(gen);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j <= i; ++j) old[i * r + j] = old[j * r + i] = normal(gen);
    std::vector<bf16> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]);
    const float alpha = 0.75f, beta = -1.5f;
    // The reference: fp64 over the same inputs (bf16's widened exactly).
    auto check = [&](const std::vector<float>& got, auto widen, const char* what) {
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < r; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < c; ++k) dot += widen(i * c + k) * widen(j * c + k);
          const double want = alpha * dot + beta * old[i * r + j];
          worst = std::max(worst, std::abs(got[i * r + j] - want));
          scale = std::max(scale, std::abs(want));
          ASSERT_EQ(got[i * r + j], got[j * r + i]) << what << " r " << r;
        }
      }
      EXPECT_LT(worst, 1e-5 * scale) << what << " r " << r << " strips " << gram_strip_count(r);
    };
    std::vector<float> got = old;
    symmetric_gram(x.data(), r, c, alpha, beta, got.data());
    auto exact = [&](int64_t i) { return static_cast<double>(x[i]); };
    check(got, exact, "fp32");  // OpenBLAS's ssyrk
    got = old;
    symmetric_gram(x.data(), r, c, alpha, beta, got.data(), device::GemmBackend::onednn);
    check(got, exact, "fp32 strips");
    got = old;
    symmetric_gram(xb.data(), r, c, alpha, beta, got.data());
    check(
        got, [&](int64_t i) { return static_cast<double>(to_float(xb[i])); }, "bf16");
  }
  EXPECT_EQ(gram_strip_count(100), 1);
  EXPECT_EQ(gram_strip_count(300), 2);
  EXPECT_EQ(gram_strip_count(520), 4);
  EXPECT_DOUBLE_EQ(gram_flop_share(512), 5.0 / 8);
}

// count standard Gaussian floats from a seeded generator.
std::vector<float> gaussian(int64_t count, unsigned seed) {
  std::vector<float> out(static_cast<size_t>(count));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  for (auto& v : out) v = normal(gen);
  return out;
}

// The quintic iteration on full GEMMs, in fp64 and written out here, for G
// [m, n] with m <= n; with bf16_inputs each GEMM's inputs are rounded to
// bf16 first, as newton_schulz_bf16 rounds them.
std::vector<double> plain_newton_schulz(const std::vector<float>& g, int64_t m, int64_t n,
                                        bool bf16_inputs, int steps = 5) {
  auto in = [&](double v) {
    return bf16_inputs ? static_cast<double>(to_float(to_bf16(static_cast<float>(v)))) : v;
  };
  std::vector<double> X(g.begin(), g.end()), A(m * m), B(m * m), Y(m * n);
  double norm = 0;
  for (double v : X) norm += v * v;
  for (double& v : X) v = static_cast<float>(v / (std::sqrt(norm) + 1e-7));
  const double ka = 3.4445, kb = -4.7750, kc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double d = 0;
        for (int64_t k = 0; k < n; ++k) d += in(X[i * n + k]) * in(X[j * n + k]);
        A[i * m + j] = d;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double d = 0;
        for (int64_t k = 0; k < m; ++k) d += in(A[i * m + k]) * in(A[k * m + j]);
        B[i * m + j] = kb * A[i * m + j] + kc * d;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t k = 0; k < m; ++k) d += in(B[i * m + k]) * in(X[k * n + j]);
        Y[i * n + j] = ka * X[i * n + j] + d;
      }
    std::swap(X, Y);
  }
  return X;
}

double relative_rms(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The iteration on symmetric_gram against the same iteration on full GEMMs
// for a matrix wide enough to be cut into strips.
TEST(Muon, NewtonSchulzMatchesAPlainGemmIteration) {
  const int64_t m = 260, n = 300;
  const std::vector<float> g = gaussian(m * n, 13);
  std::vector<float> got(m * n);
  std::vector<float> x(m * n), y(m * n), a(m * m), b(m * m);
  optim::newton_schulz(got.data(), g.data(), m, n, 5, x.data(), y.data(), a.data(), b.data());
  EXPECT_LT(relative_rms(got, plain_newton_schulz(g, m, n, false)), 1e-4);
}

// One step of the bf16 iteration (its Gram matrices' lower triangles
// rounded and mirrored in one pass) against the plain one on the same bf16
// inputs, for a tall matrix (transposed in and out, in 16 x 16 tiles with
// edges) whose Gram matrices are cut into two strips and end in a partial
// tile. One step, as further steps amplify each input that rounds the other
// way (fp32 against fp64 sums) until two correct bf16 iterations part by
// ~1% after five (a third of the way to fp32's result).
TEST(Muon, NewtonSchulzInBf16MatchesAPlainBf16Iteration) {
  const int64_t m = 300, n = 260;
  const std::vector<float> g = gaussian(m * n, 17);
  std::vector<float> gt(n * m), got(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) gt[j * m + i] = g[i * n + j];
  std::vector<float> x(m * n), y(m * n), a(n * n), b(n * n);
  std::vector<bf16> xb(m * n), ab(n * n);
  optim::newton_schulz_bf16(got.data(), g.data(), m, n, 1, x.data(), y.data(), a.data(), b.data(),
                            xb.data(), ab.data());
  auto transposed = [&](const std::vector<double>& wide) {  // [n, m] -> [m, n]
    std::vector<double> out(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) out[i * n + j] = wide[j * m + i];
    return out;
  };
  const double bf16_gap = relative_rms(got, transposed(plain_newton_schulz(gt, n, m, true, 1)));
  const double fp32_gap = relative_rms(got, transposed(plain_newton_schulz(gt, n, m, false, 1)));
  EXPECT_LT(bf16_gap, 1e-4);
  EXPECT_GT(fp32_gap, 10 * bf16_gap);  // the inputs were rounded
}

TEST(Muon, NewtonSchulzInBf16StaysCloseToFp32) {
  // A 64 x 96 Gaussian: the bf16 iteration rounds each GEMM's inputs to 8
  // mantissa bits; the iterate stays fp32, so it ends within a few bf16 ulps.
  const int64_t m = 64, n = 96;
  const std::vector<float> g = gaussian(m * n, 7);
  std::vector<float> want(m * n), got(m * n);
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

// The exact sum of squares: the same bits however the gradient is split
// (threads, ranks, shards), close to a long-double sum, NaN on a NaN or an
// infinity, 0 on zeros.
TEST(Clipping, SumOfSquaresIsExactSoSplitsDoNotChangeIt) {
  std::mt19937 rng(7);
  std::lognormal_distribution<float> mag(-6.0f, 3.0f);
  std::vector<float> g(100003);
  for (auto& x : g) x = (rng() % 2 ? -1.0f : 1.0f) * mag(rng);
  long double want = 0;
  for (float x : g) want += static_cast<long double>(x) * x;
  const double whole = optim::sum_of_squares(g.data(), static_cast<int64_t>(g.size()));
  EXPECT_NEAR(whole, static_cast<double>(want), 1e-12 * static_cast<double>(want));
  const int scale = optim::square_scale(optim::max_abs(g.data(), static_cast<int64_t>(g.size())));
  for (int64_t cut : {int64_t{1}, int64_t{1023}, int64_t{4096}, int64_t{50001}}) {
    optim::SquareSum parts = optim::scaled_square_sum(g.data(), cut, scale);
    optim::add(parts, optim::scaled_square_sum(g.data() + cut,
                                               static_cast<int64_t>(g.size()) - cut, scale));
    EXPECT_EQ(optim::square_sum_value(parts, scale), whole) << "cut at " << cut;
  }
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(optim::sum_of_squares(g.data(), static_cast<int64_t>(g.size())), whole) << threads;
  }
  omp_set_num_threads(saved);
  std::vector<float> zeros(10, 0.0f);
  EXPECT_EQ(optim::global_norm(zeros.data(), 10), 0.0);
  g[5] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(optim::global_norm(g.data(), static_cast<int64_t>(g.size()))));
  g[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(optim::global_norm(g.data(), static_cast<int64_t>(g.size()))));
}

// The GPU kernel's two words (a low word up to ~2^61 from one launch) become
// 42-bit limbs: eight ranks' sums add without overflow and keep the value.
TEST(Clipping, GpuWordsBecomeLimbsThatAddWithoutOverflow) {
  const uint64_t low = (uint64_t{1} << 61) + 12345, high = 3;
  const optim::SquareSum one = optim::square_sum_of_words(low, high);
  for (int64_t limb : one.limbs) {
    EXPECT_GE(limb, 0);
    EXPECT_LT(limb, int64_t{1} << 42);
  }
  optim::SquareSum eight;
  for (int r = 0; r < 8; ++r) optim::add(eight, one);
  const long double want = 8.0L * (static_cast<long double>(high) * 4398046511104.0L + low);
  EXPECT_DOUBLE_EQ(optim::square_sum_value(eight, 0), static_cast<double>(want));
}

// With a scale hint the sum is read in one pass at the guessed scale and its
// two neighbours: the same bits as without one, whether one of them holds
// or none does (too fine a scale's wrapped integers thrown away), and the
// hint follows the data.
TEST(Clipping, ScaleHintKeepsTheBitsAndFollowsTheLargestMagnitude) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> g(70001);
  for (auto& x : g) x = normal(rng);
  const auto n = static_cast<int64_t>(g.size());
  const double plain = optim::sum_of_squares(g.data(), n);
  const int scale = optim::square_scale(optim::max_abs(g.data(), n));
  for (int guess : {scale, scale - 2, scale + 2, scale - 4, scale + 4, scale + 40, scale - 40}) {
    std::optional<int> hint = guess;
    EXPECT_EQ(optim::sum_of_squares(g.data(), n, &hint), plain) << "guess " << guess;
    EXPECT_EQ(hint, scale) << "guess " << guess;
    const auto both = optim::max_and_square_sum(g.data(), n, guess);
    EXPECT_EQ(both.max, optim::max_abs(g.data(), n));
    const optim::SquareSum* at = both.at(scale);
    EXPECT_EQ(at != nullptr, std::abs(guess - scale) <= 2) << "guess " << guess;
    if (at) {
      EXPECT_EQ(optim::square_sum_value(*at, scale), plain) << "guess " << guess;
    }
  }
  std::optional<int> hint;  // none yet: two passes, and the hint is set
  EXPECT_EQ(optim::sum_of_squares(g.data(), n, &hint), plain);
  EXPECT_EQ(hint, scale);
  g[17] = 1e3f;  // the largest magnitude moves up: the guess fails, the sum is redone
  EXPECT_EQ(optim::sum_of_squares(g.data(), n, &hint), optim::sum_of_squares(g.data(), n));
  EXPECT_EQ(hint, optim::square_scale(1e3f));
  g[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(optim::global_norm(g.data(), n, &hint)));
  std::vector<float> zeros(10, 0.0f);
  EXPECT_EQ(optim::global_norm(zeros.data(), 10, &hint), 0.0);
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

// AdamW against the textbook update in double precision (torch.optim.AdamW's
// order: decay, moments, bias-corrected step), 3 steps, with a decayed
// matrix, an undecayed bias and a parameter at a quarter of the learning
// rate, gradients scaled by 0.5 as they are read. The decay term is ~1e-3
// of a weight, a thousand times the tolerance.
TEST(AdamW, StepsMatchTheTextbookUpdateWithDecayScaleAndGradScale) {
  ParamRegistry r;
  r.add("w", {4, 5}, Init::zeros, 0.0f, /*weight_decay=*/true);
  r.add("b", {5}, Init::zeros, 0.0f, /*weight_decay=*/false);
  r.add("slow", {3}, Init::zeros, 0.0f, /*weight_decay=*/true);
  r.scale_lr("slow", 0.25f);
  const optim::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  optim::AdamW adamw(r, cfg);
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(static_cast<size_t>(r.total()));
  for (auto& x : p) x = normal(gen);
  std::vector<double> ref(p.begin(), p.end()), m(p.size(), 0.0), v(p.size(), 0.0);
  const float lr = 1e-2f, scale = 0.5f;
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> g(p.size());
    for (auto& x : g) x = normal(gen);
    adamw.update(p.data(), g.data(), lr, step, scale);
    for (const auto& s : r.specs()) {
      const double plr = static_cast<double>(lr) * s.lr_scale;
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const auto k = static_cast<size_t>(i);
        const double gi = static_cast<double>(g[k]) * scale;
        if (s.weight_decay) ref[k] *= 1.0 - plr * cfg.weight_decay;
        m[k] = cfg.beta1 * m[k] + (1.0 - cfg.beta1) * gi;
        v[k] = cfg.beta2 * v[k] + (1.0 - cfg.beta2) * gi * gi;
        const double mhat = m[k] / (1.0 - std::pow(static_cast<double>(cfg.beta1), step));
        const double vhat = v[k] / (1.0 - std::pow(static_cast<double>(cfg.beta2), step));
        ref[k] -= plr * mhat / (std::sqrt(vhat) + cfg.eps);
      }
    }
  }
  for (size_t k = 0; k < p.size(); ++k)
    EXPECT_NEAR(p[k], ref[k], 1e-6 * std::max(1.0, std::fabs(ref[k]))) << k;
}

// bf16 training's weight copy rewritten by the update itself: the same
// weights as without it, and a copy equal to converting them afterwards;
// outside the ranges it updates the copy is left as it was. Sizes that
// cross the update's 4096-weight blocks, and a range that starts inside a
// parameter.
TEST(AdamW, Bf16CopyWrittenWithTheUpdateIsTheConvertedWeights) {
  ParamRegistry r;
  r.add("a", {5000}, Init::normal, 0.02f, true);
  r.add("b", {17}, Init::normal, 0.02f, false);
  r.add("c", {3, 2735}, Init::normal, 0.02f, true);
  const int64_t n = r.total();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (auto& x : p0) x = normal(rng);
  for (auto& x : g) x = normal(rng);
  const bf16 untouched = to_bf16(-7.0f);
  for (const std::vector<AdamW::Range>& owned :
       {std::vector<AdamW::Range>{}, std::vector<AdamW::Range>{{100, 5010}, {6000, n}}}) {
    AdamW fused(r, {}, false, owned), plain(r, {}, false, owned);
    std::vector<float> pf = p0, pp = p0;
    std::vector<bf16> low(static_cast<size_t>(n), untouched);
    for (int64_t step = 1; step <= 2; ++step) {
      fused.update(pf.data(), g.data(), 1e-2f, step, 0.5f, low.data());
      plain.update(pp.data(), g.data(), 1e-2f, step, 0.5f);
    }
    EXPECT_EQ(pf, pp);
    std::vector<bf16> want(static_cast<size_t>(n));
    kernels::convert_to_bf16(want.data(), pf.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const bool updated = owned.empty() || (i >= 100 && i < 5010) || i >= 6000;
      ASSERT_EQ(low[i].bits, updated ? want[i].bits : untouched.bits) << "element " << i;
    }
  }
}

// The step `anvil train --device cuda` takes on one process, here on a CPU
// stream: the host AdamW's bits.
TEST(DeviceAdamW, OnACpuStreamItStepsByAdamWsBitsAndNorm) {
  test_support::expect_device_adamw_is_adamw(device::DeviceKind::cpu, 0.0f);
}

// The Muon step `anvil train --device cuda --optimizer muon` takes, here on a
// CPU stream: the host Muon's updates up to the GEMMs' rounding (measured
// 1.1-1.6e-6 in fp32; in bf16 up to 2.2e-2, where a product one ulp apart
// rounds an iterate to the neighbouring bf16 value and Newton-Schulz
// carries it on).
TEST(DeviceMuon, OnACpuStreamItStepsAsMuon) {
  test_support::expect_device_muon_is_muon(device::DeviceKind::cpu, /*ns_bf16=*/false, 1e-5);
}

TEST(DeviceMuon, OnACpuStreamItStepsAsMuonWithBf16NewtonSchulz) {
  test_support::expect_device_muon_is_muon(device::DeviceKind::cpu, /*ns_bf16=*/true, 5e-2);
}

}  // namespace
}  // namespace anvil::optim
