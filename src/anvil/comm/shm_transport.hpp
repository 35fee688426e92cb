// Shared memory inside one node as a transport: one POSIX segment per
// communicator, with a barrier, per-rank staging slots, and single-copy reads
// of a buffer a peer publishes. The collectives over it are in shm.cpp.
//
// Layout: a cache line of arrival counter per rank, a published buffer per
// rank, two small slots per rank (kSmallBytes each: alternate slots let
// consecutive small collectives skip a second barrier), one staging slot of
// `chunk` bytes per rank and one result slot.
//
// Single-copy reads of a published buffer that lies in a SharedBuffer
// (base/shared_buffer.hpp) copy from the reader's own mapping of it (mapped
// on first use and kept, a few per peer); where it cannot be mapped, by
// cross-memory attach (process_vm_readv; probed once per segment), as Open
// MPI's vader does. The collectives stage plain buffers.
//
// Environment: ANVIL_SHM_CHUNK=BYTES sets the staging chunk (>= 4096; the
// default is a quarter of a core's L2, 64 KiB to 1 MiB, rank 0's for all;
// the tests use 4096 so every multi-round path runs on small messages) and
// ANVIL_SHM_CMA=0 turns cross-memory attach off (the staged copies then run
// at every size; registered buffers are then not read in place either), and
// ANVIL_SHM_DIRECT=0 reads registered buffers by cross-memory attach too (the
// all-reduce on them copies the peers' inputs into scratch a piece at a time).
//
// Waiting: a rank that arrives early spins briefly (a peer with a core of
// its own arrives within microseconds; when ranks outnumber cores it yields
// instead), then sleeps on a futex in the segment that the last arriving
// rank wakes — so ranks that share cores with compute threads
// (data-parallel training: a progress thread per rank beside the compute
// threads) do not take those cores from them.
//
// Hygiene: rank 0 creates the segment with O_CREAT|O_EXCL, mode 0600, under
// a name unique to the job (pid and a random number); the others open it;
// then it is unlinked at once, so it lives exactly as long as the processes
// that map it — normal exit, abort or kill -9 — and a stale name can never
// collide.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "anvil/comm/mpi_transport.hpp"

namespace anvil::comm {

class ShmTransport final : public Transport {
 public:
  // Collective over `group` (the segment is set up over it, and its deadline
  // is this transport's), whose ranks must share a node.
  explicit ShmTransport(MpiTransport& group, size_t chunk_bytes = 0);
  ~ShmTransport() override;

  double timeout() const override { return group_.timeout(); }
  void barrier(const char* what) override;

  const std::string& name() const { return name_; }
  size_t chunk_bytes() const { return chunk_; }
  // Rank r's staging slot (chunk_bytes()) and the shared result slot.
  unsigned char* slot(int r) const { return slots_ + static_cast<size_t>(r) * chunk_; }
  unsigned char* result() const { return result_; }
  // Rank r's small slot of a parity; each small collective takes the next parity.
  unsigned char* small_slot(int r, uint64_t parity) const {
    return small_ + (static_cast<size_t>(r) * 2 + parity) * kSmallBytes;
  }
  uint64_t next_small_parity() { return small_ops_++ % 2; }

  // True when every rank can read every other rank's memory (cross-memory attach).
  bool cma() const { return cma_; }
  // Offers [buf, buf + bytes) to the other ranks' read_published (valid after
  // the next barrier). Each rank has two publications, `which` 0 and 1 (an
  // all-reduce offers its input and its output at once).
  void publish(const void* buf, size_t bytes, int which = 0);
  // Copies `bytes` from `offset` bytes into the buffer rank r published.
  void read_published(int r, void* dst, size_t bytes, size_t offset = 0, int which = 0);
  // Rank r's published buffer as this rank's mapping of it, where it lies in
  // a registered buffer (SharedBuffer) that this rank can map; else null
  // (read_published then copies it by cross-memory attach).
  const unsigned char* published_view(int r, int which = 0);
  // Whether rank r's publication `which` lies in a registered buffer (valid
  // for a peer after the barrier that follows its publishing).
  bool published_registered(int r, int which = 0) const { return peer(r, which).region_id != 0; }
  // True when publications 0 .. `publications` - 1 of every rank lie in
  // registered buffers: the same answer on every rank after the barrier that
  // follows the publishing.
  bool all_published_registered(int publications) const;
  // A buffer of this rank's own, at least `bytes`, kept between calls.
  unsigned char* scratch(size_t bytes);
  // How many reads of a published buffer went through a mapping of a
  // registered buffer (published_view, and read_published's copies from one;
  // the rest: cross-memory attach).
  uint64_t direct_reads() const { return direct_reads_; }

  static constexpr size_t kSmallBytes = 16 * 1024;

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
    // Where the buffer lies in a SharedBuffer (region_id 0: it does not).
    int64_t fd;
    uint64_t region_id;
    uint64_t offset;
    uint64_t region_bytes;
  };
  // A peer's SharedBuffer as this rank maps it (read-only).
  struct Mapping {
    int rank;
    uint64_t id;
    const unsigned char* base;
    size_t bytes;
  };
  static constexpr size_t kMappingsPerPeer = 4;
  void probe_cma();
  // This rank's mapping of the region publication p of rank r lies in
  // (mapped now if need be), or null where it cannot be mapped (then
  // cross-memory attach reads it).
  const unsigned char* mapped(int r, const Peer& p);
  Peer& peer(int r, int which) const {
    return peers_[static_cast<size_t>(r) * 2 + (which ? 1 : 0)];
  }

  MpiTransport& group_;
  size_t chunk_ = 0;
  size_t bytes_ = 0;
  std::string name_;
  void* base_ = nullptr;
  Counter* arrive_ = nullptr;
  Peer* peers_ = nullptr;  // two per rank
  bool cma_ = false;  // process_vm_readv works between all ranks
  bool direct_ = true;             // read registered buffers through a mapping (ANVIL_SHM_DIRECT)
  std::vector<Mapping> mappings_;  // oldest first
  std::vector<char> unmappable_;   // per rank: a mapping failed once, do not retry
  uint64_t direct_reads_ = 0;
  std::vector<unsigned char> scratch_;
  unsigned char* slots_ = nullptr;
  unsigned char* result_ = nullptr;
  unsigned char* small_ = nullptr;
  uint64_t step_ = 0;
  uint64_t small_ops_ = 0;
  bool oversubscribed_ = false;
};

}  // namespace anvil::comm
