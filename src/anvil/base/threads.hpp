// The process's compute threads. anvil's kernels, OpenBLAS (OpenMP build) and
// oneDNN share one OpenMP runtime, so one setting steers all of them.
#pragma once

#include <cstdint>
#include <functional>

namespace anvil {

void set_num_threads(int n);
int num_threads();

// Runs body(k, thread) for k in [0, n) on `threads` threads, one item per
// thread at a time (dynamic, in k order), each item's own GEMMs, oneDNN
// primitives and kernels on that one thread: for many small independent
// pieces of work (same-shape Muon matrices, MoE experts), which keep a core
// busier alone than split over several. `thread` (0 .. threads-1) picks
// per-thread scratch.
void for_each_single_threaded(int64_t n, int threads,
                              const std::function<void(int64_t k, int thread)>& body);

}  // namespace anvil
