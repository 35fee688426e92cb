// Element-wise reductions, vectorised by the compiler. bf16 is combined in
// fp32 and rounded once per call. `avg` reduces as `sum`; the collective
// divides by the rank count at the end (scale_by_inverse).
#pragma once

#include <cstddef>

#include "anvil/comm/types.hpp"

namespace anvil::comm {

// dst[i] = dst[i] op src[i]
void reduce_into(void* dst, const void* src, size_t count, DType t, ReduceOp op);

// dst[i] = srcs[0][i] op srcs[1][i] op ... (in source order; dst may be a source)
void reduce_many(void* dst, const void* const* srcs, int n, size_t count, DType t, ReduceOp op);

// x[i] = x[i] / n, for avg (floating types).
void divide_by(void* x, size_t count, DType t, int n);

}  // namespace anvil::comm
