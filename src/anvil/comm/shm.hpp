// The intra-node shared-memory transport and its collectives.
//
// One POSIX shared-memory segment per communicator: a cache line of arrival
// counter per rank, two small slots per rank (messages up to 16 KiB: copy in,
// one barrier, every rank reduces everything; alternate slots make the next
// call safe without a second barrier), one staging slot of `chunk` bytes per
// rank and one result slot. A collective walks the message chunk by chunk; per chunk every rank
// copies its piece into its slot, meets the others at a counter barrier,
// reduces (or copies) its own 1/n share of the chunk, meets them again, and
// copies out. Staging stays in cache; each byte of input and output crosses
// DRAM once.
//
// All-gather and broadcast avoid the staging copy where the kernel allows
// cross-memory attach (process_vm_readv; probed once per segment): each rank
// publishes the address of its buffer and the others read it directly, one
// copy, as Open MPI's vader does.
//
// Environment: ANVIL_SHM_CHUNK=BYTES sets the staging chunk (>= 4096; the
// tests use 4096 so every multi-round path runs on small messages) and
// ANVIL_SHM_CMA=0 turns cross-memory attach off (the staged copies then run
// at every size).
//
// Waiting: a rank that arrives early spins briefly (a peer with a core of
// its own arrives within microseconds), then yields, then sleeps on a futex
// in the segment that the last arriving rank wakes — so ranks that share
// cores with compute threads (data-parallel training: a progress thread per
// rank beside the compute threads) do not take those cores from them.
//
// Hygiene: rank 0 creates the segment with O_CREAT|O_EXCL, mode 0600, under a
// name unique to the job (pid, time, counter); the others open it; then it is
// unlinked at once, so it lives exactly as long as the processes that map it
// — normal exit, abort or kill -9 — and a stale name can never collide.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "anvil/comm/types.hpp"

namespace anvil::comm {

class Communicator;

class ShmSegment {
 public:
  // Collective over `comm`, whose ranks must share a node.
  explicit ShmSegment(Communicator& comm, size_t chunk_bytes = 0);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op);
  void reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, int root);
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op);
  void allgather(const void* send, void* recv, size_t count, DType t);
  void broadcast(void* buf, size_t count, DType t, int root);

  const std::string& name() const { return name_; }
  size_t chunk_bytes() const { return chunk_; }

 private:
  // A rank's arrival count, and the futex word waiters sleep on (its low 32
  // bits, bumped after `value`) with the number of ranks asleep on it.
  struct alignas(64) Counter {
    std::atomic<uint64_t> value;
    std::atomic<uint32_t> word;
    std::atomic<uint32_t> sleepers;
  };
  // What a rank offers for single-copy reads (all-gather, broadcast).
  struct alignas(64) Peer {
    int64_t pid;
    uint64_t address;
  };
  // Copies `bytes` from `address` in rank r's memory (cross-memory attach).
  void read_from(int r, uint64_t address, void* dst, size_t bytes);
  void barrier(const char* what);
  unsigned char* slot(int r) const { return slots_ + static_cast<size_t>(r) * chunk_; }
  // Small all-reduces use their own double-buffered area and one barrier.
  unsigned char* small_slot(int r, uint64_t parity) const {
    return small_ + (static_cast<size_t>(r) * 2 + parity) * kSmallBytes;
  }
  void allreduce_small(const void* send, void* recv, size_t count, DType t, ReduceOp op);
  // The chunked all-reduce; with root >= 0 only that rank receives (reduce).
  void reduce_pipeline(const void* send, void* recv, size_t count, DType t, ReduceOp op, int root);

 public:
  static constexpr size_t kSmallBytes = 16 * 1024;
  // Below this, a kernel copy call costs more than staging (measured, 2 ranks).
  static constexpr size_t kCmaMinBytes = 64 * 1024;

 private:
  Communicator& comm_;
  int rank_, size_;
  size_t chunk_ = 0;
  size_t bytes_ = 0;
  std::string name_;
  void* base_ = nullptr;
  Counter* arrive_ = nullptr;
  Peer* peers_ = nullptr;
  bool cma_ = false;  // process_vm_readv works between all ranks
  unsigned char* slots_ = nullptr;
  unsigned char* result_ = nullptr;
  unsigned char* small_ = nullptr;
  uint64_t step_ = 0;
  uint64_t small_ops_ = 0;
  bool oversubscribed_ = false;
};

}  // namespace anvil::comm
