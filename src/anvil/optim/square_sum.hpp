// The gradients' squared L2 norm, summed exactly. Every square goes to fixed
// point (2^52 over a power of two above the largest square), and the
// integers add without rounding, so the sum does not depend on how the
// elements are split over threads, ranks, ZeRO shards or micro-batches, nor
// on the order they are added in: one rank with two micro-batches and two
// ranks clip by the same bits. The relative error against the real sum is
// below n * 2^-52 of the largest square's share (a square is rounded to the
// nearest fixed-point step; the steps are 2^-52 of the largest).
#pragma once

#include <cstdint>

namespace anvil::optim {

// The largest |g| over grads[0, n); NaN when one is NaN or infinite.
float max_abs(const float* grads, int64_t n);

// The sum of round(g^2 * 2^scale) over a range, as three 42-bit limbs (low
// first), so sums from many ranks add as int64 without overflow.
struct SquareSum {
  int64_t limbs[3] = {0, 0, 0};
};

// The fixed-point exponent for a largest magnitude `max_abs` (finite, > 0):
// every square times 2^scale is at most 2^52.
int square_scale(float max_abs);

// The fixed-point squares of grads[0, n) at `scale`, summed.
SquareSum scaled_square_sum(const float* grads, int64_t n, int scale);

// max_abs and scaled_square_sum at the scales around a guess, in one pass
// over the memory: the sums at guess - 2, guess and guess + 2 (the largest
// magnitude one power of two larger, the same, one smaller). Each is exact
// at its scale, so where square_scale(max) is one of them its sum equals
// scaled_square_sum's; the others are thrown away (a too fine scale wraps
// its integers around, without harm).
struct MaxAndSquareSum {
  float max = 0.0f;  // NaN when an element is NaN or infinite
  int guess = 0;
  SquareSum sums[3];  // at guess - 2, guess, guess + 2
  // The sum at `scale`, or null where it was not among the guesses.
  const SquareSum* at(int scale) const;
};
MaxAndSquareSum max_and_square_sum(const float* grads, int64_t n, int guess);

// high x 2^42 + low (two unsigned words, as the GPU's kernel sums them) in
// limbs of 42 bits each, so that, like every other SquareSum, it adds to
// others as int64 without overflow.
SquareSum square_sum_of_words(uint64_t low, uint64_t high);

// Limb-wise sum (for several ranges or ranks).
void add(SquareSum& into, const SquareSum& more);

// The sum of squares `s` stands for at `scale` (rounded once, to double).
double square_sum_value(const SquareSum& s, int scale);

}  // namespace anvil::optim
