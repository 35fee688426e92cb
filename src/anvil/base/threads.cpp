#include "anvil/base/threads.hpp"

#include <omp.h>

namespace anvil {

void set_num_threads(int n) {
  omp_set_num_threads(n);
}
int num_threads() {
  return omp_get_max_threads();
}

}  // namespace anvil
