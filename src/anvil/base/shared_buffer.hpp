// Registered buffers: host memory that the other ranks on the node can map
// and read with plain loads, as NCCL's registered user buffers let its
// kernels read a peer's memory in place. A SharedBuffer is an anonymous
// memory file (memfd) mapped shared; the shared-memory all-gather and
// broadcast (comm/shm.cpp) find out whether the buffer a rank publishes lies
// in one, and if so the readers map that file once (through
// /proc/PID/fd/FD, which needs the same permission as cross-memory attach)
// and copy from it in user space — measured 2-3x the bandwidth of
// process_vm_readv on 1-16 MiB (docs/comm.md), which pins and walks the
// peer's pages on every call. Plain buffers keep working: they are read by
// cross-memory attach as before.
//
// Allocating one is local (not collective); the memory is zeroed, 4 KiB
// aligned, and counts against the process like any shared mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace anvil {

class SharedBuffer {
 public:
  SharedBuffer() = default;
  // Throws SystemError (naming `what` and the size) when it cannot.
  SharedBuffer(size_t bytes, const char* what);
  ~SharedBuffer();
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  unsigned char* data() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  void release() noexcept;
  unsigned char* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

// Where [p, p + bytes) lies in a live SharedBuffer of this process: its
// memory file, a number unique to that buffer in this process's life (so a
// reader's mapping of an earlier buffer that reused the descriptor is never
// taken for it), the offset of p and the buffer's size.
struct SharedRegion {
  int fd = -1;
  uint64_t id = 0;
  size_t offset = 0;
  size_t bytes = 0;
};
std::optional<SharedRegion> shared_region_of(const void* p, size_t bytes);

}  // namespace anvil
