// The GEMM epilogues as a kernel of their own, for the GEMMs cuBLASLt has no
// fused kernel for (cublaslt_engine.cpp): epilogue.hpp's bodies per element,
// the ones the CPU engine runs and its tests check.
#include <algorithm>

#include "anvil/device/cuda_backend.hpp"
#include "anvil/device/cuda_check.hpp"
#include "anvil/device/epilogue.hpp"

namespace anvil::device::cuda {
namespace {

__global__ void epilogue_kernel(Epilogue e, float* c, int64_t m, int64_t n, int64_t ldc,
                                const float* bias, float* aux) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < m * n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / n, j = idx % n;
    float& out = c[i * ldc + j];
    const float b = bias != nullptr ? bias[j] : 0.0f;
    if (aux != nullptr)
      out = apply_epilogue(e, out, b, aux[i * ldc + j]);
    else
      out = apply_epilogue(e, out, b);
  }
}

}  // namespace

void epilogue_in_place(Epilogue e, float* c, int64_t m, int64_t n, int64_t ldc, const float* bias,
                       float* aux, void* stream) {
  if (m <= 0 || n <= 0 || e == Epilogue::none) return;
  constexpr int kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((m * n + kThreads - 1) / kThreads, 4096));
  epilogue_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      e, c, m, n, ldc, bias, uses_aux(e) ? aux : nullptr);
  check(cudaGetLastError(), "epilogue kernel launch");
}

}  // namespace anvil::device::cuda
