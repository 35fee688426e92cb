// gemm() against the reference loop: random shapes (1..300), every transpose,
// alpha/beta, padded (odd) leading dimensions, every backend and dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "anvil/device/gemm.hpp"

namespace anvil::device {
namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
};

Case random_case(std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> dim(1, 300), pad(0, 7);
  std::uniform_int_distribution<int> coin(0, 1);
  const float alphas[] = {1.0f, -0.5f, 2.0f, 0.75f};
  const float betas[] = {0.0f, 1.0f, -1.5f, 0.5f};
  Case c;
  c.ta = coin(rng);
  c.tb = coin(rng);
  c.m = dim(rng);
  c.n = dim(rng);
  c.k = dim(rng);
  c.lda = (c.ta ? c.m : c.k) + pad(rng);
  c.ldb = (c.tb ? c.k : c.n) + pad(rng);
  c.ldc = c.n + pad(rng);
  c.alpha = alphas[rng() % 4];
  c.beta = betas[rng() % 4];
  return c;
}

int64_t rows_a(const Case& c) {
  return c.ta ? c.k : c.m;
}
int64_t rows_b(const Case& c) {
  return c.tb ? c.n : c.k;
}

// Integer-valued data in [-3, 3]: every partial sum is exact in fp32, so any
// summation order must give exactly the reference (powers-of-two alpha/beta
// keep it exact).
std::vector<float> small_integers(size_t size, std::mt19937& rng) {
  std::uniform_int_distribution<int> v(-3, 3);
  std::vector<float> out(size);
  for (auto& x : out) x = static_cast<float>(v(rng));
  return out;
}

std::vector<float> uniform_reals(size_t size, std::mt19937& rng) {
  std::uniform_real_distribution<float> v(-1.0f, 1.0f);
  std::vector<float> out(size);
  for (auto& x : out) x = v(rng);
  return out;
}

void expect_gemm_matches(const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<float>& c0, GemmBackend backend, bool use_bf16,
                         double tolerance, const std::string& what) {
  std::vector<float> got = c0, want = c0;
  if (use_bf16) {
    std::vector<bf16> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
    gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a16.data(), c.lda, b16.data(), c.ldb, c.beta,
         got.data(), c.ldc, backend);
    gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a16.data(), c.lda, b16.data(), c.ldb, c.beta,
         want.data(), c.ldc, GemmBackend::reference);
  } else {
    gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), c.lda, b.data(), c.ldb, c.beta, got.data(),
         c.ldc, backend);
    gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), c.lda, b.data(), c.ldb, c.beta, want.data(),
         c.ldc, GemmBackend::reference);
  }
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.ldc; ++j) {
      const size_t idx = static_cast<size_t>(i * c.ldc + j);
      if (j >= c.n) {
        // Padding between rows of C is never written.
        ASSERT_EQ(got[idx], c0[idx]) << what << " wrote padding at (" << i << "," << j << ")";
        continue;
      }
      // Scale the bound by the magnitude of the terms summed.
      const double bound = tolerance * (std::abs(c.alpha) * static_cast<double>(c.k) +
                                        std::abs(c.beta) * std::abs(c0[idx]) + 1.0);
      ASSERT_NEAR(got[idx], want[idx], bound) << what << " at (" << i << "," << j << ")";
    }
  }
}

void run_random_cases(GemmBackend backend, bool use_bf16, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int t = 0; t < count; ++t) {
    const Case c = random_case(rng);
    const std::string what = to_string(backend) + (use_bf16 ? " bf16 " : " f32 ") + "case " +
                             std::to_string(t) + " " + (c.ta ? "T" : "N") + (c.tb ? "T" : "N") +
                             " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                             " k=" + std::to_string(c.k) + " lda=" + std::to_string(c.lda) +
                             " ldb=" + std::to_string(c.ldb) + " ldc=" + std::to_string(c.ldc);
    const size_t sa = static_cast<size_t>(rows_a(c) * c.lda);
    const size_t sb = static_cast<size_t>(rows_b(c) * c.ldb);
    const size_t sc = static_cast<size_t>(c.m * c.ldc);
    // Exact: integer data.
    expect_gemm_matches(c, small_integers(sa, rng), small_integers(sb, rng),
                        small_integers(sc, rng), backend, use_bf16, 0.0, what + " (integers)");
    // Close: real data, fp32 rounding of a k-term sum.
    expect_gemm_matches(c, uniform_reals(sa, rng), uniform_reals(sb, rng), uniform_reals(sc, rng),
                        backend, use_bf16, 2e-6, what + " (reals)");
  }
}

TEST(Gemm, OpenBlasMatchesReferenceOn250RandomShapes) {
  run_random_cases(GemmBackend::openblas, false, 250, 1);
}

TEST(Gemm, AutomaticF32MatchesReferenceOn250RandomShapes) {
  run_random_cases(GemmBackend::automatic, false, 250, 2);
}

// One row against weights stored by row (m = 1, NT: a decode step's linear
// layers), which the automatic and segments backends stream themselves:
// row counts that leave 1-3 rows after the blocks of 4, padded strides,
// every alpha and beta (beta 0 never reads C: NaN there stays out), and
// sizes on both sides of the threading threshold.
TEST(Gemm, OneRowAgainstWeightsByRowMatchesReference) {
  std::mt19937 rng(17);
  const float alphas[] = {1.0f, -0.5f, 2.0f, 0.75f};
  const float betas[] = {0.0f, 1.0f, -1.5f, 0.5f};
  int t = 0;
  for (const int64_t n : {1, 3, 4, 5, 7, 64, 301, 3000}) {
    for (const int64_t k : {1, 15, 16, 17, 300}) {
      for (const GemmBackend backend : {GemmBackend::automatic, GemmBackend::segments}) {
        Case c{false,
               true,
               1,
               n,
               k,
               k + t % 3,
               k + (t + 1) % 5,
               n + t % 2,
               alphas[t % 4],
               betas[(t / 4) % 4]};
        ++t;
        const std::string what = to_string(backend) + " n=" + std::to_string(n) +
                                 " k=" + std::to_string(k) + " beta=" + std::to_string(c.beta);
        const size_t sa = static_cast<size_t>(c.lda), sb = static_cast<size_t>(n * c.ldb),
                     sc = static_cast<size_t>(c.ldc);
        const auto a = small_integers(sa, rng), b = small_integers(sb, rng);
        expect_gemm_matches(c, a, b, small_integers(sc, rng), backend, false, 0.0,
                            what + " (integers)");
        expect_gemm_matches(c, uniform_reals(sa, rng), uniform_reals(sb, rng),
                            uniform_reals(sc, rng), backend, false, 2e-6, what + " (reals)");
        if (c.beta == 0.0f) {  // C is written, never read
          std::vector<float> out(sc, std::nanf(""));
          gemm(false, true, 1, n, k, c.alpha, a.data(), c.lda, b.data(), c.ldb, 0.0f, out.data(),
               c.ldc, backend);
          for (int64_t j = 0; j < n; ++j)
            ASSERT_TRUE(std::isfinite(out[static_cast<size_t>(j)])) << what;
        }
      }
    }
  }
}

TEST(Gemm, OneDnnF32MatchesReferenceOn200RandomShapes) {
  run_random_cases(GemmBackend::onednn, false, 200, 3);
}

// The process's bf16 path (native or emulated; CI runs this binary once more
// with ANVIL_BF16=emulated, so the fallback runs on every machine).
TEST(Gemm, Bf16MatchesReferenceOn200RandomShapes) {
  run_random_cases(GemmBackend::automatic, true, 200, 4);
}

// The fallback, asked for by name: on every CPU, whatever the automatic path.
TEST(Gemm, EmulatedBf16MatchesReferenceOn200RandomShapes) {
  run_random_cases(GemmBackend::emulated, true, 200, 5);
}

// Blocks of the widened operands far smaller than the shapes: every block
// boundary in m and n, with transposes and padded leading dimensions.
TEST(Gemm, EmulatedBf16InSmallBlocksMatchesReference) {
  std::mt19937 rng(6);
  for (int t = 0; t < 60; ++t) {
    const Case c = random_case(rng);
    const int64_t block = 16 * c.k + static_cast<int64_t>(rng() % (8 * c.k));
    const auto a = small_integers(static_cast<size_t>(rows_a(c) * c.lda), rng);
    const auto b = small_integers(static_cast<size_t>(rows_b(c) * c.ldb), rng);
    const auto c0 = small_integers(static_cast<size_t>(c.m * c.ldc), rng);
    std::vector<bf16> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
    std::vector<float> got = c0, want = c0;
    detail::gemm_bf16_emulated(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a16.data(), c.lda, b16.data(),
                               c.ldb, c.beta, got.data(), c.ldc, block);
    gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a16.data(), c.lda, b16.data(), c.ldb, c.beta,
         want.data(), c.ldc, GemmBackend::reference);
    ASSERT_EQ(got, want) << "case " << t << " m=" << c.m << " n=" << c.n << " k=" << c.k
                         << " block=" << block;
  }
}

// The path is chosen once and is the fallback wherever the CPU lacks AVX512_BF16.
TEST(Gemm, Bf16PathIsNamedAndParsed) {
  const Bf16Path path = bf16_path();
  EXPECT_FALSE(bf16_path_description(path).empty());
  if (!bf16_native_available()) {
    EXPECT_EQ(path, Bf16Path::emulated);
  }
  EXPECT_EQ(parse_gemm_backend("emulated", "--backend"), GemmBackend::emulated);
}

TEST(Gemm, BetaZeroIgnoresNanInC) {
  const int64_t m = 5, n = 7, k = 3;
  std::vector<float> a(m * k, 1.0f), b(k * n, 2.0f);
  for (auto backend : {GemmBackend::openblas, GemmBackend::onednn, GemmBackend::reference}) {
    std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
    gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n, backend);
    for (float v : c) EXPECT_EQ(v, 6.0f) << to_string(backend);
  }
}

TEST(Gemm, EmptyKScalesCByBeta) {
  std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
  const float dummy = 0.0f;
  gemm(false, false, 2, 2, 0, 1.0f, &dummy, 1, &dummy, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
}

TEST(Gemm, EmptyMOrNIsANoOp) {
  std::vector<float> c = {7.0f};
  const float dummy = 1.0f;
  gemm(false, false, 0, 1, 1, 1.0f, &dummy, 1, &dummy, 1, 0.0f, c.data(), 1);
  gemm(false, false, 1, 0, 1, 1.0f, &dummy, 1, &dummy, 1, 0.0f, c.data(), 1);
  EXPECT_EQ(c[0], 7.0f);
}

TEST(Gemm, RejectsLeadingDimensionsTooSmall) {
  std::vector<float> a(100), b(100), c(100);
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1.0f, a.data(), 3, b.data(), 4, 0.0f, c.data(), 4),
               std::invalid_argument);
  EXPECT_THROW(gemm(false, true, 4, 4, 4, 1.0f, a.data(), 4, b.data(), 3, 0.0f, c.data(), 4),
               std::invalid_argument);
  EXPECT_THROW(gemm(false, false, 4, 4, 4, 1.0f, a.data(), 4, b.data(), 4, 0.0f, c.data(), 3),
               std::invalid_argument);
  EXPECT_THROW(gemm(false, false, -1, 4, 4, 1.0f, a.data(), 4, b.data(), 4, 0.0f, c.data(), 4),
               std::invalid_argument);
}

// Debian's OpenBLAS has no bf16 GEMM: asked for bf16, the openblas backend
// widens the inputs for its sgemm (ZAYA1's expert segments, whose shapes
// change every call).
TEST(Gemm, OpenBlasBf16WidensForSgemmAndMatchesReferenceOn200RandomShapes) {
  run_random_cases(GemmBackend::openblas, true, 200, 8);
}

// Segments: fp32 on OpenBLAS; bf16 on oneDNN with the token dimension left
// to run time where bf16 is native (the emulated fallback elsewhere, and in
// CI's ANVIL_BF16=emulated run).
TEST(Gemm, SegmentsMatchReferenceOn200RandomShapes) {
  run_random_cases(GemmBackend::segments, true, 200, 9);
  run_random_cases(GemmBackend::segments, false, 100, 10);
}

// ZAYA1's expert GEMMs: the weight shape fixed, the row count different on
// every call (forward and input gradient: m; weight gradient: k, with A
// transposed and C accumulated). One primitive serves them all, so each call
// must run on its own row count, in any order.
TEST(Gemm, SegmentsRunEachCallOnItsOwnRowCount) {
  std::mt19937 rng(11);
  const int64_t n = 96, width = 80;
  const int64_t rows[] = {1, 64, 7, 130, 33, 2, 129, 64, 200};
  for (const bool weight_gradient : {false, true}) {
    for (const int64_t r : rows) {
      Case c{};
      c.ta = weight_gradient;
      c.tb = !weight_gradient;
      c.m = weight_gradient ? width : r;
      c.k = weight_gradient ? r : width;
      c.n = n;
      c.lda = width;  // A as stored: r x width
      c.ldb = weight_gradient ? n : width;      // B: r x n (gradient) or n x width
      c.ldc = n;
      c.alpha = 1.0f;
      c.beta = weight_gradient ? 1.0f : 0.0f;
      const std::string what = std::string(weight_gradient ? "dW" : "forward") +
                               " rows=" + std::to_string(r);
      expect_gemm_matches(c, small_integers(static_cast<size_t>(rows_a(c) * c.lda), rng),
                          small_integers(static_cast<size_t>(rows_b(c) * c.ldb), rng),
                          small_integers(static_cast<size_t>(c.m * c.ldc), rng),
                          GemmBackend::segments, true, 0.0, what);
    }
  }
}

TEST(Gemm, ParsesBackendNames) {
  EXPECT_EQ(parse_gemm_backend("onednn", "--backend"), GemmBackend::onednn);
  EXPECT_THROW(parse_gemm_backend("mkl", "--backend"), std::exception);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.0f / 256.0f)), 1.0f);  // tie -> even
  EXPECT_EQ(to_float(to_bf16(1.0f + 3.0f / 256.0f)), 1.0f + 4.0f / 256.0f);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace anvil::device
