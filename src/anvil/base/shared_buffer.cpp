#include "anvil/base/shared_buffer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "anvil/base/error.hpp"

namespace anvil {
namespace {

struct Live {
  const unsigned char* base;
  size_t bytes;
  int fd;
  uint64_t id;
};

// Every live SharedBuffer of the process (few: a lookup walks them).
std::mutex g_mutex;
std::vector<Live> g_live;
uint64_t g_next_id = 1;

}  // namespace

SharedBuffer::SharedBuffer(size_t bytes, const char* what) {
  if (bytes == 0) return;
  fd_ = ::memfd_create("anvil-shared", MFD_CLOEXEC);
  const auto fail = [&](const char* step) {
    const int err = errno;
    release();
    throw SystemError(std::string("shared buffer ") + what + ": " + step + " of " +
                          std::to_string(bytes) + " bytes failed: " + std::strerror(err),
                      err);
  };
  if (fd_ < 0) fail("memfd_create");
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) fail("ftruncate");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) fail("mmap");
  base_ = static_cast<unsigned char*>(p);
  bytes_ = bytes;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_live.push_back({base_, bytes_, fd_, g_next_id++});
}

SharedBuffer::~SharedBuffer() {
  release();
}

SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void SharedBuffer::release() noexcept {
  if (base_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      std::erase_if(g_live, [&](const Live& l) { return l.base == base_; });
    }
    ::munmap(base_, bytes_);
  }
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  bytes_ = 0;
  fd_ = -1;
}

std::optional<SharedRegion> shared_region_of(const void* p, size_t bytes) {
  const auto q = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Live& l : g_live) {
    const auto b = reinterpret_cast<uintptr_t>(l.base);
    if (q >= b && q - b <= l.bytes && bytes <= l.bytes - (q - b))
      return SharedRegion{l.fd, l.id, static_cast<size_t>(q - b), l.bytes};
  }
  return std::nullopt;
}

}  // namespace anvil
