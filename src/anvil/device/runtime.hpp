// The device seam: where a computation runs (this CPU, or a CUDA GPU), its
// memory, streams and events, and copies between host and device. The layers
// above are written against these types; only the device layer's own sources
// include a vendor header (cudart, cuBLASLt, NCCL), so a HIP build replaces
// those sources and nothing above them (docs/gpu.md).
//
// Memory is planned once, as on the CPU (tensor/arena.hpp): a DeviceArena is
// one allocation per kind of memory (parameters, gradients, ...), and the
// buffers carved from it are 256-byte aligned, what cuBLASLt and vector loads
// want. On the CPU kind every call runs at once on the calling thread and a
// Stream is only a name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace anvil::device {

enum class DeviceKind { cpu, cuda };

std::string to_string(DeviceKind kind);
// "cpu" or "cuda"; InputError naming `flag` otherwise.
DeviceKind parse_device(const std::string& name, const std::string& flag);

// Whether this binary has the CUDA backends (-DANVIL_CUDA).
bool cuda_built();
// Empty when a CUDA device can be used now; otherwise why not, in one line
// ("built without CUDA (ANVIL_CUDA=off)", "no CUDA driver: cudaGetDeviceCount
// returned 35 (CUDA driver version is insufficient for CUDA runtime version)").
std::string cuda_unavailable_reason();
// Throws SystemError with cuda_unavailable_reason(), prefixed by `flag`, when
// `kind` is cuda and no CUDA device can be used.
void require(DeviceKind kind, const std::string& flag);

// What one GPU is, as the runtime reports it.
struct GpuProperties {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  double clock_ghz = 0;         // SM boost clock
  double memory_clock_ghz = 0;  // 0 where the runtime no longer reports it
  int memory_bus_bits = 0;
  int64_t memory_bytes = 0;
  int64_t l2_bytes = 0;
  std::string pci_bus_id;  // "0000:18:00.0"
  std::string pcie_link;   // "32.0 GT/s PCIe x16" (sysfs), empty when unknown
  int nvlinks_active = -1; // NVML; -1 when NVML is not available
  int driver_version = 0;  // 13000 = 13.0
  int runtime_version = 0;
  int cublaslt_version = 0;  // 130100 = 13.1.0; 0 when not loaded
  std::string nccl_version;  // "2.28.9"; empty when libnccl.so.2 is not found
  bool has_fp8 = false;      // compute capability 8.9 or later
};

int gpu_count();  // 0 where none can be used
GpuProperties gpu_properties(int ordinal = 0);
// Makes GPU `ordinal` this thread's current device: the one its later
// streams, buffers and GEMM engines use (cudaSetDevice).
void select_gpu(int ordinal);
// The current GPU's memory now (cudaMemGetInfo): what is free, of how much.
struct GpuMemory {
  int64_t free_bytes = 0, total_bytes = 0;
};
GpuMemory gpu_memory();
// The GPU a process of a multi-process run takes: its rank on the node
// (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, else `rank`) modulo the GPUs.
int gpu_for_rank(int rank);
// The processes of this run on this node (Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE; 1 outside mpirun).
int ranks_on_node();

class Event;

class Stream {
 public:
  explicit Stream(DeviceKind kind = DeviceKind::cpu);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  DeviceKind kind() const { return kind_; }
  void synchronize();
  // Work queued here after this call waits for `event`'s recorded point
  // (cudaStreamWaitEvent; the CPU runs in order, so nothing to wait for).
  void wait(const Event& event);
  void* native() const { return handle_; }  // cudaStream_t on CUDA, null on the CPU

 private:
  DeviceKind kind_ = DeviceKind::cpu;
  void* handle_ = nullptr;
};

// A point in a stream's work, for timing: elapsed_ms(start, stop) is the
// device time between two recorded events (wall time on the CPU).
class Event {
 public:
  explicit Event(DeviceKind kind = DeviceKind::cpu);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream& stream);
  void synchronize();
  static double elapsed_ms(const Event& start, const Event& stop);
  void* native() const { return handle_; }  // cudaEvent_t on CUDA, null on the CPU

 private:
  DeviceKind kind_ = DeviceKind::cpu;
  void* handle_ = nullptr;  // cudaEvent_t
  double cpu_seconds_ = 0;
};

// Where a DeviceBuffer lives: the device's memory, or host memory the
// device copies to and from at the link's speed (page-locked by
// cudaHostAlloc for cuda, zeroed; on the CPU both are plain host memory).
enum class Memory { device, pinned_host };

// One allocation for a device, 256-byte aligned, released on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws SystemError naming `name` when the memory cannot be had.
  DeviceBuffer(DeviceKind kind, size_t bytes, const std::string& name,
               Memory memory = Memory::device);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DeviceKind kind() const { return kind_; }
  size_t bytes() const { return bytes_; }
  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void release();
  DeviceKind kind_ = DeviceKind::cpu;
  Memory memory_ = Memory::device;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Sizes requests before anything is allocated: add() returns each one's
// offset, 256-byte aligned; total() is the one allocation they need.
class ArenaPlan {
 public:
  static constexpr size_t kAlign = 256;
  static size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  size_t add(size_t bytes);
  size_t total() const { return total_; }
  size_t requests() const { return requests_; }

 private:
  size_t total_ = 0;
  size_t requests_ = 0;
};

// One allocation per kind of memory, carved in the order the plan was made.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(DeviceKind kind, const std::string& name, const ArenaPlan& plan);
  // The next `bytes`, 256-byte aligned; throws SystemError naming the arena
  // when the plan was too small (a planning bug, never a user error).
  void* take(size_t bytes);
  template <class T>
  T* take(int64_t count) {
    return static_cast<T*>(take(static_cast<size_t>(count) * sizeof(T)));
  }
  size_t capacity() const { return buffer_.bytes(); }
  size_t used() const { return used_; }
  DeviceKind kind() const { return buffer_.kind(); }

 private:
  std::string name_;
  DeviceBuffer buffer_;
  size_t used_ = 0;
};

enum class CopyKind { host_to_device, device_to_host, device_to_device };

// Copies `bytes`; with a CUDA stream the copy is queued on it (asynchronous
// for pinned host memory), on the CPU it happens now.
void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& stream);
// Sets `bytes` to zero on the stream's device.
void zero(void* dst, size_t bytes, Stream& stream);

// Host <-> device helpers for tests and benchmarks (synchronous).
template <class T>
void upload(const std::vector<T>& host, void* dst, Stream& stream) {
  copy(dst, host.data(), host.size() * sizeof(T), CopyKind::host_to_device, stream);
  stream.synchronize();
}
template <class T>
std::vector<T> download(const void* src, size_t count, Stream& stream) {
  std::vector<T> host(count);
  copy(host.data(), src, count * sizeof(T), CopyKind::device_to_host, stream);
  stream.synchronize();
  return host;
}

}  // namespace anvil::device
