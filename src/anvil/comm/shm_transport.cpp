#include "anvil/comm/shm_transport.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <new>
#include <random>
#include <vector>

#include "anvil/base/clock.hpp"
#include "anvil/base/cpu.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/shared_buffer.hpp"

namespace anvil::comm {
namespace {

// The staging slot: a quarter of a core's L2, 64 KiB to 1 MiB. A round
// writes the rank's chunk, reads it back and reads its peers': at a quarter
// those lines stay in L2. At the whole L2 (1 MiB on Zen 5) the staged
// all-gather fell to 5 GB/s busbw from 2 MiB up whenever the host's memory
// was busy, against 10-12 with 256 or 512 KiB chunks in the same minutes
// (docs/comm.md).
size_t default_chunk() {
  const int64_t l2 = cpu_info().l2_bytes;
  const int64_t quarter = l2 > 0 ? l2 / 4 : int64_t{256} * 1024;
  return static_cast<size_t>(std::clamp<int64_t>(quarter, 64 * 1024, 1024 * 1024)) / 64 * 64;
}

size_t chunk_from_env(size_t asked) {
  if (asked) return asked;
  if (const char* e = std::getenv("ANVIL_SHM_CHUNK")) {
    const long long v = std::atoll(e);
    if (v >= 4096) return static_cast<size_t>(v) / 64 * 64;
  }
  return default_chunk();
}

// A job killed after rank 0 created its segment but before every rank had
// opened it leaves the name behind; names carry the creator's pid, so remove
// those whose creator is gone. (Our own names never collide: O_EXCL.)
void remove_stale_segments() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("anvil-", 0) != 0) continue;
    const long pid = std::atol(name.c_str() + 6);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::shm_unlink(("/" + name).c_str());
    }
  }
}

// Barrier waits: ~kSpins pause instructions (tens of microseconds), then
// futex sleeps. Only when ranks outnumber cores do they yield first (the
// rank waited for may need this core): beside compute threads a yield hands
// the core to one of them for its whole time slice, and a call of many
// meetings then took 2-10x as long as with the sleep, whose wake-up gets
// the core back at once.
constexpr unsigned kSpins = 2048;
constexpr unsigned kYields = 16;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen) {
  const timespec timeout{0, 1000000};  // 1 ms
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &timeout, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

ShmTransport::ShmTransport(MpiTransport& group, size_t chunk_bytes)
    : Transport(group.rank(), group.size()), group_(group), chunk_(chunk_from_env(chunk_bytes)) {
  // Rank 0's chunk for all: every rank maps the segment at the size it implies.
  uint64_t chunk = chunk_;
  MPI_Bcast(&chunk, 1, MPI_UINT64_T, 0, group.mpi_comm());
  chunk_ = static_cast<size_t>(chunk);
  const size_t header = static_cast<size_t>(size()) * (sizeof(Counter) + 2 * sizeof(Peer));
  const size_t small = static_cast<size_t>(size()) * 2 * kSmallBytes;
  bytes_ = header + small + static_cast<size_t>(size() + 1) * chunk_;
  oversubscribed_ = size() > static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));

  char name[64] = {};
  int fd = -1;
  if (rank() == 0) {
    remove_stale_segments();
    std::random_device rd;
    for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
      std::snprintf(name, sizeof name, "/anvil-%d-%08x", static_cast<int>(::getpid()), rd());
      fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      ::close(fd);
      ::shm_unlink(name);
      fd = -1;
    }
    if (fd < 0) name[0] = '\0';
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, group.mpi_comm());
  if (name[0] == '\0') throw SystemError("shm: rank 0 could not create a segment in /dev/shm");
  name_ = name;
  if (rank() != 0) fd = ::shm_open(name, O_RDWR, 0600);
  int ok = fd >= 0;
  if (ok) {
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ok = base_ != MAP_FAILED;
    if (!ok) base_ = nullptr;
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, group.mpi_comm());
  // Everyone has it mapped (or failed): the name is no longer needed.
  if (rank() == 0) ::shm_unlink(name);
  if (!all_ok) {
    if (base_) ::munmap(base_, bytes_);
    throw SystemError("shm: a rank could not map segment " + name_ + " (" + std::strerror(errno) +
                      ")");
  }
  arrive_ = static_cast<Counter*>(base_);
  peers_ = reinterpret_cast<Peer*>(static_cast<unsigned char*>(base_) +
                                   static_cast<size_t>(size()) * sizeof(Counter));
  small_ = static_cast<unsigned char*>(base_) + header;
  slots_ = small_ + small;
  result_ = slots_ + static_cast<size_t>(size()) * chunk_;
  if (rank() == 0) {
    for (int r = 0; r < size(); ++r) new (&arrive_[r]) Counter{{0}, {0}, {0}};
  }
  MPI_Barrier(group.mpi_comm());
  probe_cma();
  const char* direct_env = std::getenv("ANVIL_SHM_DIRECT");
  direct_ = !(direct_env && std::string(direct_env) == "0");
  unmappable_.assign(static_cast<size_t>(size()), 0);
}

void ShmTransport::probe_cma() {
  // Read a word the next rank published.
  static thread_local uint64_t probe_word;
  probe_word = 0x5eed0000u + static_cast<uint64_t>(rank());
  peer(rank(), 0) =
      Peer{static_cast<int64_t>(::getpid()), reinterpret_cast<uint64_t>(&probe_word), -1, 0, 0, 0};
  MPI_Barrier(group_.mpi_comm());
  const int next = (rank() + 1) % size();
  uint64_t got = 0;
  iovec local{&got, sizeof got}, remote{reinterpret_cast<void*>(peer(next, 0).address), sizeof got};
  // ANVIL_SHM_CMA=0 turns it off (the staged copies then run at every size).
  const char* cma_env = std::getenv("ANVIL_SHM_CMA");
  const bool cma_allowed = !(cma_env && std::string(cma_env) == "0");
  int ok_cma = cma_allowed &&
               ::process_vm_readv(static_cast<pid_t>(peer(next, 0).pid), &local, 1, &remote, 1,
                                  0) == static_cast<ssize_t>(sizeof got) &&
               got == 0x5eed0000u + static_cast<uint64_t>(next);
  int all_cma = 0;
  MPI_Allreduce(&ok_cma, &all_cma, 1, MPI_INT, MPI_MIN, group_.mpi_comm());
  cma_ = all_cma != 0;
}

void ShmTransport::publish(const void* buf, size_t bytes, int which) {
  Peer p{static_cast<int64_t>(::getpid()), reinterpret_cast<uint64_t>(buf), -1, 0, 0, 0};
  if (const auto region = shared_region_of(buf, bytes)) {
    p.fd = region->fd;
    p.region_id = region->id;
    p.offset = region->offset;
    p.region_bytes = region->bytes;
  }
  peer(rank(), which) = p;
}

const unsigned char* ShmTransport::mapped(int r, const Peer& p) {
  for (const Mapping& m : mappings_) {
    if (m.rank == r && m.id == p.region_id) return m.base;
  }
  if (unmappable_[static_cast<size_t>(r)]) return nullptr;
  // The publisher keeps the buffer (and its descriptor) alive until the
  // collective's last barrier, so the descriptor names that memory file now.
  const std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(p.fd);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  void* base = MAP_FAILED;
  if (fd >= 0) {
    base = ::mmap(nullptr, p.region_bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
  }
  if (base == MAP_FAILED) {
    unmappable_[static_cast<size_t>(r)] = 1;
    return nullptr;
  }
  // Keep a few per peer: drop this peer's oldest beyond them.
  size_t of_peer = 0;
  for (const Mapping& m : mappings_) of_peer += m.rank == r;
  if (of_peer >= kMappingsPerPeer) {
    const auto oldest = std::find_if(mappings_.begin(), mappings_.end(),
                                     [&](const Mapping& m) { return m.rank == r; });
    ::munmap(const_cast<unsigned char*>(oldest->base), oldest->bytes);
    mappings_.erase(oldest);
  }
  mappings_.push_back({r, p.region_id, static_cast<const unsigned char*>(base),
                       static_cast<size_t>(p.region_bytes)});
  return mappings_.back().base;
}

const unsigned char* ShmTransport::published_view(int r, int which) {
  const Peer& p = peer(r, which);
  if (!direct_ || p.region_id == 0) return nullptr;
  const unsigned char* base = mapped(r, p);
  if (!base) return nullptr;
  ++direct_reads_;
  return base + p.offset;
}

bool ShmTransport::all_published_registered(int publications) const {
  for (int r = 0; r < size(); ++r)
    for (int which = 0; which < publications; ++which)
      if (!published_registered(r, which)) return false;
  return true;
}

unsigned char* ShmTransport::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void ShmTransport::read_published(int r, void* dst, size_t bytes, size_t offset, int which) {
  const Peer& p = peer(r, which);
  if (const unsigned char* src = published_view(r, which)) {
    std::memcpy(dst, src + offset, bytes);
    return;
  }
  uint64_t address = p.address + offset;
  auto* d = static_cast<unsigned char*>(dst);
  while (bytes > 0) {
    iovec local{d, bytes}, remote{reinterpret_cast<void*>(address), bytes};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(p.pid), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw SystemError("shm: process_vm_readv from rank " + std::to_string(r) +
                        " failed: " + std::strerror(errno));
    }
    d += n;
    address += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

ShmTransport::~ShmTransport() {
  for (const Mapping& m : mappings_) ::munmap(const_cast<unsigned char*>(m.base), m.bytes);
  if (base_) ::munmap(base_, bytes_);
}

void ShmTransport::barrier(const char* what) {
  ++step_;
  Counter& mine = arrive_[rank()];
  mine.value.store(step_, std::memory_order_seq_cst);
  mine.word.store(static_cast<uint32_t>(step_), std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&mine.word);
  // Spin (or, when ranks outnumber cores, yield: the one we wait for may
  // need ours), then sleep until woken (or 1 ms, a bound on any race).
  const unsigned spin_limit = oversubscribed_ ? 0 : kSpins;
  const unsigned yield_limit = oversubscribed_ ? kYields : 0;
  const double deadline = now_seconds() + timeout();
  for (int q = 0; q < size(); ++q) {
    Counter& peer = arrive_[q];
    unsigned waits = 0;
    while (peer.value.load(std::memory_order_acquire) < step_) {
      ++waits;
      if (waits < spin_limit) {
        cpu_relax();
        continue;
      }
      if (waits < spin_limit + yield_limit) {
        ::sched_yield();
      } else {
        const uint32_t seen = peer.word.load(std::memory_order_seq_cst);
        peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
        if (peer.value.load(std::memory_order_seq_cst) < step_) futex_wait(&peer.word, seen);
        peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      }
      if (waits % 64 == 0 && now_seconds() > deadline) {
        std::vector<int> missing;
        for (int m = 0; m < size(); ++m) {
          if (arrive_[m].value.load(std::memory_order_acquire) < step_) missing.push_back(m);
        }
        fail_timeout(std::string(what) + "(shm)", static_cast<int>(step_), missing);
      }
    }
  }
}

}  // namespace anvil::comm
