#include "anvil/device/runtime.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/device/cuda_backend.hpp"

namespace anvil::device {
std::string to_string(DeviceKind kind) { return kind == DeviceKind::cuda ? "cuda" : "cpu"; }

DeviceKind parse_device(const std::string& name, const std::string& flag) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda" || name == "gpu") return DeviceKind::cuda;
  throw InputError(flag + ": expected cpu or cuda, got '" + name + "'");
}

bool cuda_built() { return cuda::built(); }

std::string cuda_unavailable_reason() { return cuda::unavailable_reason(); }

void require(DeviceKind kind, const std::string& flag) {
  if (kind != DeviceKind::cuda) return;
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) throw SystemError(flag + " cuda: no CUDA device can be used: " + why);
}

int gpu_count() { return cuda::unavailable_reason().empty() ? cuda::device_count() : 0; }

GpuProperties gpu_properties(int ordinal) {
  require(DeviceKind::cuda, "--device");
  return cuda::properties(ordinal);
}

void select_gpu(int ordinal) {
  require(DeviceKind::cuda, "--device");
  cuda::select(ordinal);
}

GpuMemory gpu_memory() {
  require(DeviceKind::cuda, "--device");
  GpuMemory m;
  cuda::memory_info(&m.free_bytes, &m.total_bytes);
  return m;
}

int gpu_for_rank(int rank) {
  int local = rank;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"); env != nullptr && *env != '\0')
    local = std::atoi(env);
  const int count = gpu_count();
  return count > 0 ? local % count : 0;
}

int ranks_on_node() {
  const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int n = env != nullptr ? std::atoi(env) : 1;
  return n > 0 ? n : 1;
}

// Stream ---------------------------------------------------------------------

Stream::Stream(DeviceKind kind) : kind_(kind) {
  if (kind_ == DeviceKind::cuda) handle_ = cuda::stream_create();
}
Stream::~Stream() {
  if (handle_) cuda::stream_destroy(handle_);
}
Stream::Stream(Stream&& o) noexcept
    : kind_(o.kind_), handle_(std::exchange(o.handle_, nullptr)) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (handle_) cuda::stream_destroy(handle_);
    kind_ = o.kind_;
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}
void Stream::synchronize() {
  if (kind_ == DeviceKind::cuda) cuda::stream_synchronize(handle_);
}
void Stream::wait(const Event& event) {
  if (kind_ == DeviceKind::cuda) cuda::stream_wait_event(handle_, event.native());
}

// Event ----------------------------------------------------------------------

Event::Event(DeviceKind kind) : kind_(kind) {
  if (kind_ == DeviceKind::cuda) handle_ = cuda::event_create();
}
Event::~Event() {
  if (handle_) cuda::event_destroy(handle_);
}
Event::Event(Event&& o) noexcept
    : kind_(o.kind_), handle_(std::exchange(o.handle_, nullptr)), cpu_seconds_(o.cpu_seconds_) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_) cuda::event_destroy(handle_);
    kind_ = o.kind_;
    handle_ = std::exchange(o.handle_, nullptr);
    cpu_seconds_ = o.cpu_seconds_;
  }
  return *this;
}
void Event::record(Stream& stream) {
  if (kind_ == DeviceKind::cuda) {
    cuda::event_record(handle_, stream.native());
  } else {
    cpu_seconds_ = now_seconds();
  }
}
void Event::synchronize() {
  if (kind_ == DeviceKind::cuda) cuda::event_synchronize(handle_);
}
double Event::elapsed_ms(const Event& start, const Event& stop) {
  if (start.kind_ == DeviceKind::cuda) return cuda::event_elapsed_ms(start.handle_, stop.handle_);
  return (stop.cpu_seconds_ - start.cpu_seconds_) * 1e3;
}

// DeviceBuffer ---------------------------------------------------------------

DeviceBuffer::DeviceBuffer(DeviceKind kind, size_t bytes, const std::string& name, Memory memory)
    : kind_(kind), memory_(memory), bytes_(bytes) {
  const size_t asked = ArenaPlan::rounded(bytes == 0 ? 1 : bytes);
  if (kind_ == DeviceKind::cuda && memory_ == Memory::device) {
    data_ = cuda::allocate(asked, name);  // cudaMalloc: 256-byte aligned
  } else if (kind_ == DeviceKind::cuda) {
    data_ = cuda::allocate_pinned(asked, name);  // page-aligned
  } else {
    data_ = std::aligned_alloc(ArenaPlan::kAlign, asked);
    if (!data_)
      throw SystemError(name + ": cannot allocate " + std::to_string(bytes) + " bytes on the CPU");
  }
  if (memory_ == Memory::pinned_host) std::memset(data_, 0, asked);
}
DeviceBuffer::~DeviceBuffer() { release(); }
void DeviceBuffer::release() {
  if (!data_) return;
  if (kind_ == DeviceKind::cpu)
    std::free(data_);
  else if (memory_ == Memory::device)
    cuda::release(data_);
  else
    cuda::release_pinned(data_);
  data_ = nullptr;
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : kind_(o.kind_),
      memory_(o.memory_),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    kind_ = o.kind_;
    memory_ = o.memory_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// Arenas ---------------------------------------------------------------------

size_t ArenaPlan::add(size_t bytes) {
  const size_t offset = total_;
  total_ += rounded(bytes);
  ++requests_;
  return offset;
}

DeviceArena::DeviceArena(DeviceKind kind, const std::string& name, const ArenaPlan& plan)
    : name_(name), buffer_(kind, plan.total(), name) {}

void* DeviceArena::take(size_t bytes) {
  const size_t need = ArenaPlan::rounded(bytes);
  if (used_ + need > buffer_.bytes()) {
    throw SystemError(name_ + ": arena planned for " + std::to_string(buffer_.bytes()) +
                      " bytes, asked for " + std::to_string(used_ + need));
  }
  void* p = static_cast<char*>(buffer_.data()) + used_;
  used_ += need;
  return p;
}

// Copies ---------------------------------------------------------------------

void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& stream) {
  if (bytes == 0) return;
  if (stream.kind() == DeviceKind::cuda) {
    cuda::copy(dst, src, bytes, kind, stream.native());
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void zero(void* dst, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  if (stream.kind() == DeviceKind::cuda) {
    cuda::zero(dst, bytes, stream.native());
  } else {
    std::memset(dst, 0, bytes);
  }
}

}  // namespace anvil::device
