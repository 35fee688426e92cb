// The local token dispatcher: the assignments sorted by expert (stable, skip
// not dispatched) are the experts' rows as they are — the experts write
// their outputs where combine reads them, no copy either way — and each
// token gets back the input gradients of its dispatched rows.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "anvil/model/carver.hpp"
#include "anvil/model/zaya_dispatcher.hpp"

namespace anvil::model {
namespace {

TEST(LocalDispatcher, HandsTheSortedRowsToTheExpertsInPlace) {
  const ZayaMoeShape s{.hidden = 3, .experts = 3, .expert_ffn = 2, .top_k = 2};  // 3 = skip
  const int64_t N = 5, H = s.hidden;
  const std::vector<int32_t> choice = {0, 3, 2, 0, 3, 1, 1, 2, 0, 3};
  LocalDispatcher::Scratch scratch{};
  LocalDispatcher d(s, N, &scratch);
  const tensor::Arena arena = carve_arena("test", [&](Carver& c) {
    scratch.carve(c, s, N);
    d.carve(c);
  });
  std::vector<float> x(N * H);
  for (int64_t i = 0; i < N * H; ++i) x[i] = static_cast<float>(i);

  const ExpertRows& rows = d.dispatch(x.data(), choice.data());
  ASSERT_EQ(rows.experts, 3);
  EXPECT_EQ(std::vector<int64_t>(rows.offsets, rows.offsets + 4),
            (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(d.sorted_rows(), 7);
  const std::vector<int64_t> token_of_row = {0, 1, 4, 2, 3, 1, 3};  // by expert, then token
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t c = 0; c < H; ++c) {
      EXPECT_EQ(rows.x[r * H + c], x[token_of_row[r] * H + c]) << "row " << r;
    }
  }
  EXPECT_EQ(d.gather_outputs(), rows.y);  // combine reads the experts' outputs in place
  EXPECT_EQ(d.slots()[1], -1);            // token 0's second choice: skip

  std::vector<float> dys(N * 2 * H, 1.0f), dxs(N * 2 * H, 5.0f), dx(N * H, 0.5f);
  const ExpertGrads& g = d.dispatch_grads(dys.data(), dxs.data());
  EXPECT_EQ(g.dy, dys.data());
  ASSERT_EQ(g.dx, dxs.data());
  // The experts write every row of g.dx (experts_backward): no clearing.
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t c = 0; c < H; ++c) g.dx[r * H + c] = static_cast<float>(r + 1);
  }
  d.gather_grads(dx.data());
  // Token n gets 0.5 plus (row + 1) of each of its dispatched rows.
  const std::vector<float> want = {1.5f, 8.5f, 4.5f, 12.5f, 3.5f};
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < H; ++c) EXPECT_EQ(dx[n * H + c], want[n]) << "token " << n;
  }
}

}  // namespace
}  // namespace anvil::model
