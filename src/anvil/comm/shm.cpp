#include "anvil/comm/shm.hpp"

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
#include "anvil/base/error.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm {
namespace {

constexpr size_t kDefaultChunk = 1024 * 1024;  // measured best of 64K..1M on 2 ranks

size_t chunk_from_env(size_t asked) {
  if (asked) return asked;
  if (const char* e = std::getenv("ANVIL_SHM_CHUNK")) {
    const long long v = std::atoll(e);
    if (v >= 4096) return static_cast<size_t>(v) / 64 * 64;
  }
  return kDefaultChunk;
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
// kYields sched_yield calls, then futex sleeps.
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

ShmSegment::ShmSegment(Communicator& comm, size_t chunk_bytes)
    : comm_(comm), rank_(comm.rank()), size_(comm.size()), chunk_(chunk_from_env(chunk_bytes)) {
  const size_t header = static_cast<size_t>(size_) * (sizeof(Counter) + sizeof(Peer));
  const size_t small = static_cast<size_t>(size_) * 2 * kSmallBytes;
  bytes_ = header + small + static_cast<size_t>(size_ + 1) * chunk_;
  oversubscribed_ = size_ > static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));

  char name[64] = {};
  int fd = -1;
  if (rank_ == 0) {
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
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm.mpi_comm());
  if (name[0] == '\0') throw SystemError("shm: rank 0 could not create a segment in /dev/shm");
  name_ = name;
  if (rank_ != 0) fd = ::shm_open(name, O_RDWR, 0600);
  int ok = fd >= 0;
  if (ok) {
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ok = base_ != MAP_FAILED;
    if (!ok) base_ = nullptr;
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm.mpi_comm());
  // Everyone has it mapped (or failed): the name is no longer needed.
  if (rank_ == 0) ::shm_unlink(name);
  if (!all_ok) {
    if (base_) ::munmap(base_, bytes_);
    throw SystemError("shm: a rank could not map segment " + name_ + " (" + std::strerror(errno) +
                      ")");
  }
  arrive_ = static_cast<Counter*>(base_);
  peers_ = reinterpret_cast<Peer*>(static_cast<unsigned char*>(base_) +
                                   static_cast<size_t>(size_) * sizeof(Counter));
  small_ = static_cast<unsigned char*>(base_) + header;
  slots_ = small_ + small;
  result_ = slots_ + static_cast<size_t>(size_) * chunk_;
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) new (&arrive_[r]) Counter{{0}, {0}, {0}};
  }
  MPI_Barrier(comm.mpi_comm());

  // Probe cross-memory attach: read a word the next rank published.
  static thread_local uint64_t probe_word;
  probe_word = 0x5eed0000u + static_cast<uint64_t>(rank_);
  peers_[rank_] = Peer{static_cast<int64_t>(::getpid()), reinterpret_cast<uint64_t>(&probe_word)};
  MPI_Barrier(comm.mpi_comm());
  const int next = (rank_ + 1) % size_;
  uint64_t got = 0;
  iovec local{&got, sizeof got}, remote{reinterpret_cast<void*>(peers_[next].address), sizeof got};
  // ANVIL_SHM_CMA=0 turns it off (the staged copies then run at every size).
  const char* cma_env = std::getenv("ANVIL_SHM_CMA");
  const bool cma_allowed = !(cma_env && std::string(cma_env) == "0");
  int ok_cma = cma_allowed &&
               ::process_vm_readv(static_cast<pid_t>(peers_[next].pid), &local, 1, &remote, 1, 0) ==
                   static_cast<ssize_t>(sizeof got) &&
               got == 0x5eed0000u + static_cast<uint64_t>(next);
  int all_cma = 0;
  MPI_Allreduce(&ok_cma, &all_cma, 1, MPI_INT, MPI_MIN, comm.mpi_comm());
  cma_ = all_cma != 0;
}

void ShmSegment::read_from(int r, uint64_t address, void* dst, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  while (bytes > 0) {
    iovec local{d, bytes}, remote{reinterpret_cast<void*>(address), bytes};
    const ssize_t n =
        ::process_vm_readv(static_cast<pid_t>(peers_[r].pid), &local, 1, &remote, 1, 0);
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

ShmSegment::~ShmSegment() {
  if (base_) ::munmap(base_, bytes_);
}

void ShmSegment::barrier(const char* what) {
  ++step_;
  Counter& mine = arrive_[rank_];
  mine.value.store(step_, std::memory_order_seq_cst);
  mine.word.store(static_cast<uint32_t>(step_), std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&mine.word);
  // Spin (not when ranks outnumber cores: the one we wait for may need
  // ours), then yield, then sleep until woken (or 1 ms, a bound on any race).
  const unsigned spin_limit = oversubscribed_ ? 0 : kSpins;
  const double deadline = now_seconds() + comm_.timeout();
  for (int q = 0; q < size_; ++q) {
    Counter& peer = arrive_[q];
    unsigned waits = 0;
    while (peer.value.load(std::memory_order_acquire) < step_) {
      ++waits;
      if (waits < spin_limit) {
        cpu_relax();
        continue;
      }
      if (waits < spin_limit + kYields) {
        ::sched_yield();
      } else {
        const uint32_t seen = peer.word.load(std::memory_order_seq_cst);
        peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
        if (peer.value.load(std::memory_order_seq_cst) < step_) futex_wait(&peer.word, seen);
        peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      }
      if (waits % 64 == 0 && now_seconds() > deadline) {
        std::vector<int> missing;
        for (int m = 0; m < size_; ++m) {
          if (arrive_[m].value.load(std::memory_order_acquire) < step_) missing.push_back(m);
        }
        comm_.fail_timeout(std::string(what) + "(shm)", static_cast<int>(step_), missing);
      }
    }
  }
}

void ShmSegment::allreduce_small(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  const uint64_t parity = small_ops_++ % 2;
  const size_t bytes = count * size_of(t);
  std::memcpy(small_slot(rank_, parity), send, bytes);
  barrier("allreduce");
  std::vector<const void*> srcs(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) srcs[static_cast<size_t>(r)] = small_slot(r, parity);
  reduce_many(recv, srcs.data(), size_, count, t, op);
  if (op == ReduceOp::avg) divide_by(recv, count, t, size_);
}

void ShmSegment::allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  if (count * size_of(t) <= kSmallBytes) return allreduce_small(send, recv, count, t, op);
  reduce_pipeline(send, recv, count, t, op, -1);
}

void ShmSegment::reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                        int root) {
  reduce_pipeline(send, recv, count, t, op, root);
}

void ShmSegment::reduce_pipeline(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                                 int root) {
  // Per chunk, rank r owns portion r. Only the portions other ranks reduce
  // are staged; rank r reads its own portion straight from its send buffer,
  // reduces it into its output (or, for a reduce on another root, into the
  // result slot) and publishes it in the result slot, from which the ranks
  // that want the result copy the other portions. Per byte of message each
  // rank moves ~2 bytes in and ~2 out (n = 2), against ~3 and ~3 for stage-all.
  const size_t es = size_of(t);
  const size_t per_chunk = chunk_ / es;
  const bool wants_result = root < 0 || rank_ == root;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  const char* what = root < 0 ? "allreduce" : "reduce";
  std::vector<const void*> srcs(static_cast<size_t>(size_));
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t len = std::min(per_chunk, count - off);
    const unsigned char* chunk_in = in + off * es;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const size_t po = block_offset(len, size_, j) * es;
      std::memcpy(slot(rank_) + po, chunk_in + po, block_count(len, size_, j) * es);
    }
    barrier(what);
    const size_t po = block_offset(len, size_, rank_) * es;
    const size_t pc = block_count(len, size_, rank_);
    for (int r = 0; r < size_; ++r) {
      srcs[static_cast<size_t>(r)] = r == rank_ ? chunk_in + po : slot(r) + po;
    }
    unsigned char* mine = wants_result ? out + off * es + po : result_ + po;
    reduce_many(mine, srcs.data(), size_, pc, t, op);
    if (op == ReduceOp::avg) divide_by(mine, pc, t, size_);
    if (mine != result_ + po && root < 0) std::memcpy(result_ + po, mine, pc * es);
    barrier(what);
    if (!wants_result) continue;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const size_t pj = block_offset(len, size_, j) * es;
      std::memcpy(out + off * es + pj, result_ + pj, block_count(len, size_, j) * es);
    }
  }
}

void ShmSegment::reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  if (count * size_of(t) <= kSmallBytes) {
    const uint64_t parity = small_ops_++ % 2;
    const size_t es = size_of(t);
    std::memcpy(small_slot(rank_, parity), send, count * es);
    barrier("reduce_scatter");
    const size_t off = block_offset(count, size_, rank_) * es;
    std::vector<const void*> srcs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) srcs[static_cast<size_t>(r)] = small_slot(r, parity) + off;
    const size_t mine = block_count(count, size_, rank_);
    reduce_many(recv, srcs.data(), size_, mine, t, op);
    if (op == ReduceOp::avg) divide_by(recv, mine, t, size_);
    return;
  }
  // Round k: every rank stages piece k of every block (piece capacity
  // chunk/n); rank r reduces piece k of block r straight into its output.
  const size_t es = size_of(t);
  const size_t piece = std::max<size_t>(1, chunk_ / es / static_cast<size_t>(size_));
  const size_t largest = block_count(count, size_, 0);
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  std::vector<const void*> srcs(static_cast<size_t>(size_));
  for (size_t k0 = 0; k0 < largest; k0 += piece) {
    for (int j = 0; j < size_; ++j) {
      const size_t bc = block_count(count, size_, j);
      if (k0 >= bc || j == rank_) continue;  // our own piece is read in place
      const size_t len = std::min(piece, bc - k0);
      std::memcpy(slot(rank_) + static_cast<size_t>(j) * piece * es,
                  in + (block_offset(count, size_, j) + k0) * es, len * es);
    }
    barrier("reduce_scatter");
    const size_t mine = block_count(count, size_, rank_);
    if (k0 < mine) {
      const size_t len = std::min(piece, mine - k0);
      for (int r = 0; r < size_; ++r) {
        srcs[static_cast<size_t>(r)] = r == rank_
                                           ? in + (block_offset(count, size_, rank_) + k0) * es
                                           : slot(r) + static_cast<size_t>(rank_) * piece * es;
      }
      reduce_many(out + k0 * es, srcs.data(), size_, len, t, op);
      if (op == ReduceOp::avg) divide_by(out + k0 * es, len, t, size_);
    }
    barrier("reduce_scatter");
  }
}

void ShmSegment::allgather(const void* send, void* recv, size_t count, DType t) {
  const size_t es = size_of(t);
  if (count * es <= kSmallBytes) {  // one barrier, alternate small slots
    const uint64_t parity = small_ops_++ % 2;
    const size_t mine = block_count(count, size_, rank_);
    if (mine) std::memcpy(small_slot(rank_, parity), send, mine * es);
    barrier("allgather");
    auto* out = static_cast<unsigned char*>(recv);
    for (int j = 0; j < size_; ++j) {
      const size_t bc = block_count(count, size_, j);
      unsigned char* dst = out + block_offset(count, size_, j) * es;
      if (bc && dst != send) std::memcpy(dst, small_slot(j, parity), bc * es);
    }
    return;
  }
  if (cma_ && count * es > kCmaMinBytes) {
    auto* out = static_cast<unsigned char*>(recv);
    const size_t mine = block_count(count, size_, rank_);
    unsigned char* my_block = out + block_offset(count, size_, rank_) * es;
    peers_[rank_] = Peer{static_cast<int64_t>(::getpid()), reinterpret_cast<uint64_t>(send)};
    barrier("allgather");
    for (int s = 1; s < size_; ++s) {
      const int j = (rank_ + s) % size_;  // start at different peers: no hot spot
      const size_t bc = block_count(count, size_, j);
      if (bc) read_from(j, peers_[j].address, out + block_offset(count, size_, j) * es, bc * es);
    }
    if (send != my_block && mine) std::memcpy(my_block, send, mine * es);
    barrier("allgather");  // nobody reuses its send buffer before all have read it
    return;
  }
  const size_t per_chunk = chunk_ / es;
  const size_t largest = block_count(count, size_, 0);
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  const size_t my_count = block_count(count, size_, rank_);
  const bool in_place = in == out + block_offset(count, size_, rank_) * es;
  for (size_t k0 = 0; k0 < largest; k0 += per_chunk) {
    if (k0 < my_count)
      std::memcpy(slot(rank_), in + k0 * es, std::min(per_chunk, my_count - k0) * es);
    barrier("allgather");
    for (int j = 0; j < size_; ++j) {
      const size_t bc = block_count(count, size_, j);
      if (k0 >= bc || (j == rank_ && in_place)) continue;
      std::memcpy(out + (block_offset(count, size_, j) + k0) * es, slot(j),
                  std::min(per_chunk, bc - k0) * es);
    }
    barrier("allgather");
  }
}

void ShmSegment::broadcast(void* buf, size_t count, DType t, int root) {
  const size_t es = size_of(t);
  if (count * es <= kSmallBytes) {
    const uint64_t parity = small_ops_++ % 2;
    if (rank_ == root) std::memcpy(small_slot(root, parity), buf, count * es);
    barrier("broadcast");
    if (rank_ != root) std::memcpy(buf, small_slot(root, parity), count * es);
    return;
  }
  if (cma_ && count * es > kCmaMinBytes) {
    if (rank_ == root)
      peers_[root] = Peer{static_cast<int64_t>(::getpid()), reinterpret_cast<uint64_t>(buf)};
    barrier("broadcast");
    if (rank_ != root) read_from(root, peers_[root].address, buf, count * es);
    barrier("broadcast");
    return;
  }
  const size_t per_chunk = chunk_ / es;
  auto* data = static_cast<unsigned char*>(buf);
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t len = std::min(per_chunk, count - off);
    if (rank_ == root) std::memcpy(slot(root), data + off * es, len * es);
    barrier("broadcast");
    if (rank_ != root) std::memcpy(data + off * es, slot(root), len * es);
    barrier("broadcast");
  }
}

}  // namespace anvil::comm
