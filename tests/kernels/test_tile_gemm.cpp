// tile_gemm (attention's register-blocked tile kernel) against a double
// reference. This file is also built on its own with -march=x86-64-v3
// (tile_gemm_avx2_tests), so the AVX2 form is tested on AVX-512 machines too.
#include "anvil/kernels/tile_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "support/gradient_check.hpp"

namespace anvil::kernels {
namespace {

using test_support::random_vector;

// tile_gemm on random shapes, strides and both layouts of A against a double
// reference: every edge block (1..6 rows, 1..4 vectors), k = 0, alpha != 1,
// and accumulating into C or overwriting it.
TEST(TileGemm, MatchesADoubleReferenceOnRandomShapes) {
  const int64_t lanes = tile_gemm_lanes();
  if (lanes == 0) GTEST_SKIP() << "this build has no tile kernel (no AVX2 + FMA)";
  if (lanes == 8 && !__builtin_cpu_supports("avx2"))
    GTEST_SKIP() << "the AVX2 form on a CPU without AVX2";
  SCOPED_TRACE(tile_gemm_description());
  std::mt19937 gen(17);
  std::uniform_int_distribution<int64_t> rows(1, 40), vecs(1, 10), depth(0, 70);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t m = rows(gen), n = vecs(gen) * lanes, k = depth(gen);
    const bool transposed = trial % 2 == 1, accumulate = trial % 3 == 0;
    const float alpha = trial % 5 == 0 ? 0.125f : 1.0f;
    const int64_t lda = (transposed ? m : k) + 3, ldb = n + 5, ldc = n + 7;
    const auto a = random_vector((transposed ? k : m) * lda + 1, 100 + trial);
    const auto b = random_vector(std::max<int64_t>(k, 1) * ldb, 200 + trial);
    auto c = random_vector(m * ldc, 300 + trial);
    const std::vector<float> c0 = c;
    const int64_t a_row = transposed ? 1 : lda, a_col = transposed ? lda : 1;
    tile_gemm(m, n, k, alpha, accumulate, a.data(), a_row, a_col, b.data(), ldb, c.data(), ldc);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= n) {  // past the n columns: untouched
          ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "trial " << trial;
          continue;
        }
        double want = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double t = static_cast<double>(a[i * a_row + p * a_col]) * b[p * ldb + j];
          want += t;
          mag += std::abs(t);
        }
        want *= alpha;
        if (accumulate) want += c0[i * ldc + j];
        ASSERT_NEAR(c[i * ldc + j], want, 1e-6 * (mag + 1))
            << "trial " << trial << " m " << m << " n " << n << " k " << k << " at " << i << ","
            << j;
      }
    }
  }
}

// tile_transpose copies exactly (8 x 8 register blocks and the scalar edges),
// and writes nothing past the n columns of each of the D rows.
TEST(TileGemm, TransposeCopiesEveryBlockAndEdgeExactly) {
  std::mt19937 gen(23);
  std::uniform_int_distribution<int64_t> size(1, 40);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = size(gen), D = size(gen), stride = D + trial % 5, ldt = n + trial % 3;
    const auto rows = random_vector(n * stride, 400 + trial);
    std::vector<float> bt(D * ldt, -7.0f);
    tile_transpose(bt.data(), ldt, rows.data(), stride, n, D);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < ldt; ++j)
        ASSERT_EQ(bt[d * ldt + j], j < n ? rows[j * stride + d] : -7.0f)
            << "trial " << trial << " n " << n << " D " << D << " at " << d << "," << j;
  }
}

// Special values in every lane of the vector blocks and the scalar tail:
// subnormals (which VCVTNEPS2BF16 alone would read as zero), the smallest
// normal, ties, the largest float, infinities, NaNs and -0. Every
// conversion gives the scalar rounding's bits.
TEST(TileGemm, Bf16ConversionsGiveTheScalarBitsForSpecialValues) {
  const float specials[] = {1e-40f,
                            -1e-40f,
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            1.0f + 1.0f / 256.0f,
                            1.0f + 3.0f / 256.0f,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7f800001u),
                            -0.0f,
                            1.1754942e-38f,
                            3.0f};
  const int64_t n = 4, cols = 2 * 25;  // two 16-wide blocks and a tail per row
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = specials[(i * 7) % std::size(specials)];
  std::vector<bf16> flat(x.size());
  to_bf16(flat.data(), x.data(), static_cast<int64_t>(x.size()));
  std::vector<uint32_t> along(static_cast<size_t>(n * cols / 2)),
      across(static_cast<size_t>(n / 2 * cols));
  bf16_pairs_along_rows(along.data(), cols / 2, x.data(), cols, n, cols);
  bf16_pairs_across_rows(across.data(), cols, x.data(), cols, n, cols);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const auto k = static_cast<size_t>(i * cols + j);
      const uint16_t want = to_bf16(x[k]).bits;
      ASSERT_EQ(flat[k].bits, want) << i << "," << j << ": " << x[k];
      const uint32_t a = along[static_cast<size_t>(i * cols / 2 + j / 2)];
      ASSERT_EQ(j % 2 == 0 ? a & 0xffffu : a >> 16, want) << i << "," << j << ": " << x[k];
      const uint32_t c = across[static_cast<size_t>(i / 2 * cols + j)];
      ASSERT_EQ(i % 2 == 0 ? c & 0xffffu : c >> 16, want) << i << "," << j << ": " << x[k];
    }
  }
  EXPECT_EQ(to_bf16(1e-40f).bits, 0x0001);  // a subnormal stays one
}

// The bf16 pairs: the halves of a pair are the two values rounded to bf16,
// the lower k (or row) low; a missing odd row is zero.
TEST(TileGemm, Bf16PairsHoldTheRoundedValuesInOrder) {
  auto half = [](uint32_t pair, int which) {
    return to_float(bf16{static_cast<uint16_t>(which == 0 ? pair & 0xffffu : pair >> 16)});
  };
  auto rounded = [](float x) { return to_float(to_bf16(x)); };
  std::mt19937 gen(29);
  std::uniform_int_distribution<int64_t> size(1, 40);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t n = size(gen), cols = 2 * size(gen), stride = cols + trial % 3;
    const auto x = random_vector(n * stride, 500 + trial);
    std::vector<uint32_t> along(n * cols / 2), across((n + 1) / 2 * cols);
    bf16_pairs_along_rows(along.data(), cols / 2, x.data(), stride, n, cols);
    bf16_pairs_across_rows(across.data(), cols, x.data(), stride, n, cols);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        ASSERT_EQ(half(along[i * cols / 2 + j / 2], j % 2), rounded(x[i * stride + j]))
            << "trial " << trial << " along at " << i << "," << j;
        ASSERT_EQ(half(across[i / 2 * cols + j], i % 2), rounded(x[i * stride + j]))
            << "trial " << trial << " across at " << i << "," << j;
      }
    }
    if (n % 2 != 0) {
      for (int64_t j = 0; j < cols; ++j) ASSERT_EQ(across[n / 2 * cols + j] >> 16, 0u);
    }
  }
}

// tile_gemm_bf16 against a double reference of the same bf16 values: the
// products are exact in fp32, so only the fp32 sums' rounding is left.
TEST(TileGemm, Bf16PairsMatchADoubleReferenceOnRandomShapes) {
  if (!tile_gemm_bf16_available()) GTEST_SKIP() << "no AVX512_BF16 tile kernel on this CPU/build";
  std::mt19937 gen(31);
  std::uniform_int_distribution<int64_t> rows(1, 40), vecs(1, 10), depth(0, 40);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t m = rows(gen), n = vecs(gen) * 16, kp = depth(gen), k = 2 * kp;
    const bool transposed = trial % 2 == 1, accumulate = trial % 3 == 0;
    const float alpha = trial % 5 == 0 ? 0.125f : 1.0f;
    // A as m x k values: pairs along rows (row-major), or, transposed,
    // pairs across the rows of its k x m transpose (a_row 1, a_col = ld).
    const auto a = random_vector(m * k, 600 + trial), b = random_vector(k * n, 700 + trial);
    std::vector<float> at(k * m);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) at[p * m + i] = a[i * k + p];
    const int64_t lda = transposed ? m + 3 : kp + 2, ldb = n + 16, ldc = n + 7;
    std::vector<uint32_t> ap((transposed ? kp : m) * lda + 1), bp(std::max<int64_t>(kp, 1) * ldb);
    if (transposed) {
      bf16_pairs_across_rows(ap.data(), lda, at.data(), m, k, m);
    } else {
      bf16_pairs_along_rows(ap.data(), lda, a.data(), k, m, k);
    }
    bf16_pairs_across_rows(bp.data(), ldb, b.data(), n, k, n);
    auto c = random_vector(m * ldc, 800 + trial);
    const std::vector<float> c0 = c;
    const int64_t a_row = transposed ? 1 : lda, a_col = transposed ? lda : 1;
    tile_gemm_bf16(m, n, kp, alpha, accumulate, ap.data(), a_row, a_col, bp.data(), ldb, c.data(),
                   ldc);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= n) {
          ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "trial " << trial;
          continue;
        }
        double want = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double t = static_cast<double>(to_float(to_bf16(a[i * k + p]))) *
                           to_float(to_bf16(b[p * n + j]));
          want += t;
          mag += std::abs(t);
        }
        want *= alpha;
        if (accumulate) want += c0[i * ldc + j];
        ASSERT_NEAR(c[i * ldc + j], want, 1e-6 * (mag + 1))
            << "trial " << trial << " m " << m << " n " << n << " k " << k << " at " << i << ","
            << j;
      }
    }
  }
}

}  // namespace
}  // namespace anvil::kernels
