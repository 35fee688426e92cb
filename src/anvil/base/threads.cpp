#include "anvil/base/threads.hpp"

#include <omp.h>

namespace anvil {

void set_num_threads(int n) {
  omp_set_num_threads(n);
}
int num_threads() {
  return omp_get_max_threads();
}

void for_each_single_threaded(int64_t n, int threads,
                              const std::function<void(int64_t k, int thread)>& body) {
#pragma omp parallel num_threads(threads)
  {
    omp_set_num_threads(1);  // this thread's nested regions and oneDNN primitives: 1 thread
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < n; ++k) body(k, omp_get_thread_num());
  }
}

}  // namespace anvil
