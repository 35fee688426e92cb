// The one header of GPU aliases. Kernels are written in the subset CUDA and
// HIP share, against these names, so a HIP build (the paper's MI300X) swaps
// this header's right-hand sides and nothing else (docs/gpu.md lists what else
// such a build needs: hipBLASLt and RCCL behind the same seam).
//
// ANVIL_HD marks a per-element or per-row body that both a device kernel and
// a CPU loop run: the CPU tests check the GPU's arithmetic through it. In a
// plain C++ translation unit it expands to nothing.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ANVIL_HD __host__ __device__
#define ANVIL_DEVICE_CODE 1
#else
#define ANVIL_HD
#define ANVIL_DEVICE_CODE 0
#endif

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define gpuStream_t hipStream_t
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetLastError hipGetLastError
#define gpuGetErrorString hipGetErrorString
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define gpuStream_t cudaStream_t
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorString cudaGetErrorString
#endif
