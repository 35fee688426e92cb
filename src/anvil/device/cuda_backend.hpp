// Internal to the device layer: the CUDA side of runtime.hpp, gemm_engine.hpp
// and collectives.hpp. cuda_runtime.cpp implements it with cudart (and
// cuda_stream_kernels.cu the kernels) where the build has CUDA;
// cuda_absent.cpp implements it where it does not, every call failing with
// the reason. Nothing outside src/anvil/device includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "anvil/base/dtype.hpp"
#include "anvil/device/epilogue.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/device/stream_kernels.hpp"

namespace anvil::device {
class GemmEngine;
}

namespace anvil::device::cuda {

bool built();
std::string unavailable_reason();
int device_count();
void select(int ordinal);
GpuProperties properties(int ordinal);
// The current device's free and total memory in bytes (cudaMemGetInfo).
void memory_info(int64_t* free_bytes, int64_t* total_bytes);

void* allocate(size_t bytes, const std::string& name);
void release(void* p);
// Page-locked host memory (cudaHostAlloc): copies to and from it run at
// the link's speed and asynchronously.
void* allocate_pinned(size_t bytes, const std::string& name);
void release_pinned(void* p);
void copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream);
void zero(void* dst, size_t bytes, void* stream);

void* stream_create();
void stream_destroy(void* s);
void stream_synchronize(void* s);
void* event_create();
void event_destroy(void* e);
void event_record(void* e, void* s);
void event_synchronize(void* e);
void stream_wait_event(void* s, void* e);
double event_elapsed_ms(void* start, void* stop);

// `passes` passes of a memory-bandwidth kernel over n doubles; `sink` (one
// double on the device) receives the read kernel's sum.
void stream_passes(stream::Kernel kernel, double* a, double* b, double* c, int64_t n, int passes,
                   double* sink, void* stream);

std::unique_ptr<GemmEngine> make_cublaslt_engine();
// Epilogue `e` over an m x n fp32 matrix (row stride ldc) in place, for a
// GEMM cuBLASLt has no fused kernel for: epilogue.hpp's bodies, one thread
// per element. `aux` has c's shape and stride (for the aux epilogues).
void epilogue_in_place(Epilogue e, float* c, int64_t m, int64_t n, int64_t ldc, const float* bias,
                       float* aux, void* stream);

// fp16 / fp8 e4m3 <-> float on the host (cuda_fp16.h, cuda_fp8.h).
void encode_narrow(const float* in, size_t n, Dtype type, unsigned char* out);
void decode_narrow(const unsigned char* in, size_t n, Dtype type, float* out);

}  // namespace anvil::device::cuda
