// Internal to the device layer's CUDA sources: CUDA errors as SystemError.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "anvil/base/error.hpp"

namespace anvil::device::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw SystemError(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")");
}

// cublasLtGetVersion() of the loaded cuBLASLt (cublaslt_engine.cpp).
int cublaslt_version();

}  // namespace anvil::device::cuda
