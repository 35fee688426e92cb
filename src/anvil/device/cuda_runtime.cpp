// The CUDA side of the seam (cuda_backend.hpp) on the CUDA runtime API.
// Linked with the static runtime, so the binary needs only the driver
// (libcuda.so.1) at run time, and starts without one.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <mutex>

#include "anvil/base/error.hpp"
#include "anvil/device/collectives.hpp"
#include "anvil/device/cuda_backend.hpp"
#include "anvil/device/cuda_check.hpp"
#include "anvil/device/dynamic_library.hpp"

namespace anvil::device::cuda {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "32.0 GT/s PCIe x16" from sysfs, empty when the files are not there. An
// idle GPU lowers its link (to 2.5 GT/s), so where the current link is
// below the maximum both show: "2.5 GT/s PCIe x16 now, 32.0 GT/s PCIe x16 max".
std::string pcie_link(const std::string& bus_id) {
  std::string id = bus_id;
  for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string dir = "/sys/bus/pci/devices/" + id + "/";
  const std::string speed = read_line(dir + "current_link_speed");
  const std::string width = read_line(dir + "current_link_width");
  if (speed.empty() || width.empty()) return "";
  const std::string now = speed + " x" + width;
  const std::string max_speed = read_line(dir + "max_link_speed");
  const std::string max_width = read_line(dir + "max_link_width");
  if (max_speed.empty() || max_width.empty()) return now;
  const std::string max = max_speed + " x" + max_width;
  return max == now ? now : now + " now, " + max + " max";
}

// Why the runtime found no usable driver, in words a user can act on:
// none loaded (cudaDriverGetVersion gives 0: libcuda.so.1's own error), or
// one older than this build's runtime needs.
std::string driver_problem(cudaError_t e) {
  int driver = 0;
  cudaDriverGetVersion(&driver);
  cudaGetLastError();
  if (driver == 0) {
    std::string error;
    if (void* lib = open_library("libcuda.so.1", error); lib != nullptr)
      return "the CUDA runtime found no driver, though libcuda.so.1 loads";
    return "no GPU driver: " + error;
  }
  if (e == cudaErrorInsufficientDriver) {
    return "the driver supports CUDA " + std::to_string(driver / 1000) + "." +
           std::to_string(driver % 1000 / 10) + ", this build's runtime needs " +
           std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10) +
           " (a newer driver, or CUDA's forward-compatibility libcuda from cuda/compat on the "
           "library path)";
  }
  return "";
}

// Active NVLinks through NVML (part of the driver), -1 where NVML is absent.
int active_nvlinks(const std::string& bus_id) {
  std::string error;
  const char* name = "libnvidia-ml.so.1";
  void* lib = open_library(name, error);
  if (!lib) return -1;
  int (*init)() = nullptr;
  int (*by_bus)(const char*, void**) = nullptr;
  int (*state)(void*, unsigned, int*) = nullptr;
  bind_symbol(lib, name, "nvmlInit_v2", init, error);
  bind_symbol(lib, name, "nvmlDeviceGetHandleByPciBusId_v2", by_bus, error);
  bind_symbol(lib, name, "nvmlDeviceGetNvLinkState", state, error);
  void* dev = nullptr;
  if (!init || !by_bus || !state || init() != 0 || by_bus(bus_id.c_str(), &dev) != 0) return -1;
  int active = 0;
  for (unsigned link = 0; link < 18; ++link) {
    int on = 0;
    if (state(dev, link, &on) == 0 && on) ++active;
  }
  return active;
}

}  // namespace

bool built() { return true; }

std::string unavailable_reason() {
  static std::once_flag once;
  static std::string reason;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      reason = "cudaGetDeviceCount returned " + std::to_string(static_cast<int>(e)) + " (" +
               cudaGetErrorString(e) + ")";
      cudaGetLastError();  // clear it
      if (const std::string why = driver_problem(e); !why.empty()) reason += ": " + why;
    } else if (count == 0) {
      reason = "the CUDA runtime sees no GPU";
    }
  });
  return reason;
}

int device_count() {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  return count;
}

void select(int ordinal) {
  check(cudaSetDevice(ordinal), "cudaSetDevice");
}

void memory_info(int64_t* free_bytes, int64_t* total_bytes) {
  size_t f = 0, t = 0;
  check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
}

GpuProperties properties(int ordinal) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, ordinal), "cudaGetDeviceProperties");
  GpuProperties g;
  g.ordinal = ordinal;
  g.name = p.name;
  g.cc_major = p.major;
  g.cc_minor = p.minor;
  g.sms = p.multiProcessorCount;
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, ordinal) == cudaSuccess)
    g.clock_ghz = khz / 1e6;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, ordinal) == cudaSuccess)
    g.memory_clock_ghz = khz / 1e6;
  int bits = 0;
  if (cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, ordinal) == cudaSuccess)
    g.memory_bus_bits = bits;
  cudaGetLastError();
  g.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  g.l2_bytes = p.l2CacheSize;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) == cudaSuccess) g.pci_bus_id = bus;
  g.pcie_link = pcie_link(g.pci_bus_id);
  g.nvlinks_active = active_nvlinks(g.pci_bus_id);
  cudaDriverGetVersion(&g.driver_version);
  cudaRuntimeGetVersion(&g.runtime_version);
  g.cublaslt_version = cublaslt_version();
  g.nccl_version = nccl_version();
  g.has_fp8 = g.cc_major * 10 + g.cc_minor >= 89;
  return g;
}

void* allocate(size_t bytes, const std::string& name) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw SystemError(name + ": cudaMalloc of " + std::to_string(bytes) +
                      " bytes failed: " + cudaGetErrorString(e));
  }
  return p;
}

void release(void* p) { cudaFree(p); }

void* allocate_pinned(size_t bytes, const std::string& name) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw SystemError(name + ": cudaHostAlloc of " + std::to_string(bytes) +
                      " bytes failed: " + cudaGetErrorString(e));
  }
  return p;
}

void release_pinned(void* p) {
  cudaFreeHost(p);
}

void copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) {
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  check(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
}

void zero(void* dst, size_t bytes, void* stream) {
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void* stream_create() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void stream_destroy(void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
void stream_synchronize(void* s) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
}

void* event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
void event_destroy(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
void event_record(void* e, void* s) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)),
        "cudaEventRecord");
}
void event_synchronize(void* e) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
}
void stream_wait_event(void* s, void* e) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0),
        "cudaStreamWaitEvent");
}
double event_elapsed_ms(void* start, void* stop) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)),
        "cudaEventElapsedTime");
  return ms;
}

void encode_narrow(const float* in, size_t n, Dtype type, unsigned char* out) {
  if (type == Dtype::fp16) {
    auto* h = reinterpret_cast<__half*>(out);
    for (size_t i = 0; i < n; ++i) h[i] = __float2half_rn(in[i]);
  } else {
    auto* f = reinterpret_cast<__nv_fp8_e4m3*>(out);
    for (size_t i = 0; i < n; ++i) f[i] = __nv_fp8_e4m3(in[i]);
  }
}

void decode_narrow(const unsigned char* in, size_t n, Dtype type, float* out) {
  if (type == Dtype::fp16) {
    const auto* h = reinterpret_cast<const __half*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = __half2float(h[i]);
  } else {
    const auto* f = reinterpret_cast<const __nv_fp8_e4m3*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(f[i]);
  }
}

}  // namespace anvil::device::cuda
