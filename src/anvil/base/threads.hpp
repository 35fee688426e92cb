// The process's compute threads. anvil's kernels, OpenBLAS (OpenMP build) and
// oneDNN share one OpenMP runtime, so one setting steers all of them.
#pragma once

namespace anvil {

void set_num_threads(int n);
int num_threads();

}  // namespace anvil
