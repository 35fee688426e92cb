// Collectives over the shared-memory transport (shm_transport.hpp), chunked
// and pipelined. Messages up to kSmallBytes: copy in, one barrier, every rank
// reduces everything. Larger ones go chunk by chunk; per chunk every rank
// copies its piece into its slot, meets the others at a barrier, reduces (or
// copies) its own 1/n share of the chunk, meets them again, and copies out.
// Staging stays in cache; each byte of input and output crosses DRAM once.
// Above kCmaMinBytes a buffer that is registered (a SharedBuffer) is read in
// place instead, from the reader's own mapping of it (by process_vm_readv
// where it cannot map it): all-gather and broadcast in two barriers,
// all-reduce and reduce-scatter on registered buffers in three and two.
// Plain buffers stay staged: a process_vm_readv, which pins the peer's
// pages on every call, ran slower than the two user-space copies.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm::algo {
namespace {

// Below this, a kernel copy call costs more than staging (measured, 2 ranks).
constexpr size_t kCmaMinBytes = 64 * 1024;

// ANVIL_SHM_ALLREDUCE=staged|direct: whether a large all-reduce or
// reduce-scatter on registered buffers runs staged or direct (measuring aid).
bool direct_allreduce() {
  static const bool direct = [] {
    const char* e = std::getenv("ANVIL_SHM_ALLREDUCE");
    return !(e && std::string(e) == "staged");
  }();
  return direct;
}

void allreduce_small(ShmTransport& shm, const void* send, void* recv, size_t count, DType t,
                     ReduceOp op) {
  const int rank = shm.rank(), size = shm.size();
  const uint64_t parity = shm.next_small_parity();
  const size_t bytes = count * size_of(t);
  std::memcpy(shm.small_slot(rank, parity), send, bytes);
  shm.barrier("allreduce");
  std::vector<const void*> srcs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) srcs[static_cast<size_t>(r)] = shm.small_slot(r, parity);
  reduce_many(recv, srcs.data(), size, count, t, op);
  if (op == ReduceOp::avg) divide_by(recv, count, t, size);
}

void reduce_pipeline(ShmTransport& shm, const void* send, void* recv, size_t count, DType t,
                     ReduceOp op, int root) {
  const int rank = shm.rank(), size = shm.size();
  // Per chunk, rank r owns portion r. Only the portions other ranks reduce
  // are staged; rank r reads its own portion straight from its send buffer,
  // reduces it into its output (or, for a reduce on another root, into the
  // result slot) and publishes it in the result slot, from which the ranks
  // that want the result copy the other portions. Per byte of message each
  // rank moves ~2 bytes in and ~2 out (n = 2), against ~3 and ~3 for stage-all.
  const size_t es = size_of(t);
  const size_t per_chunk = shm.chunk_bytes() / es;
  const bool wants_result = root < 0 || rank == root;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  const char* what = root < 0 ? "allreduce" : "reduce";
  std::vector<const void*> srcs(static_cast<size_t>(size));
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t len = std::min(per_chunk, count - off);
    const unsigned char* chunk_in = in + off * es;
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      const size_t po = block_offset(len, size, j) * es;
      std::memcpy(shm.slot(rank) + po, chunk_in + po, block_count(len, size, j) * es);
    }
    shm.barrier(what);
    const size_t po = block_offset(len, size, rank) * es;
    const size_t pc = block_count(len, size, rank);
    for (int r = 0; r < size; ++r) {
      srcs[static_cast<size_t>(r)] = r == rank ? chunk_in + po : shm.slot(r) + po;
    }
    unsigned char* mine = wants_result ? out + off * es + po : shm.result() + po;
    reduce_many(mine, srcs.data(), size, pc, t, op);
    if (op == ReduceOp::avg) divide_by(mine, pc, t, size);
    if (mine != shm.result() + po && root < 0) std::memcpy(shm.result() + po, mine, pc * es);
    shm.barrier(what);
    if (!wants_result) continue;
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      const size_t pj = block_offset(len, size, j) * es;
      std::memcpy(out + off * es + pj, shm.result() + pj, block_count(len, size, j) * es);
    }
  }
}

// Elements [po, po + pc) of every rank's published input (publication 0;
// this rank's own is `in`), reduced in rank order into `dst`: straight from
// the mappings of registered peers, by cross-memory attach into scratch, a
// piece at a time, from a peer this rank cannot map. The order is
// reduce_pipeline's, so both give the same bits.
void reduce_block_from_peers(ShmTransport& shm, const unsigned char* in, unsigned char* dst,
                             size_t po, size_t pc, DType t, ReduceOp op) {
  const int rank = shm.rank(), size = shm.size();
  const size_t es = size_of(t);
  std::vector<const unsigned char*> views(static_cast<size_t>(size));
  size_t copied = 0;  // peers read by cross-memory attach
  for (int r = 0; r < size; ++r) {
    views[static_cast<size_t>(r)] = r == rank ? in : shm.published_view(r, 0);
    copied += views[static_cast<size_t>(r)] == nullptr;
  }
  const size_t piece = std::max<size_t>(1, shm.chunk_bytes() / es / std::max<size_t>(copied, 1));
  unsigned char* scratch = copied ? shm.scratch(copied * piece * es) : nullptr;
  std::vector<const void*> srcs(static_cast<size_t>(size));
  for (size_t k = 0; k < pc; k += piece) {
    const size_t len = std::min(piece, pc - k), at = (po + k) * es;
    size_t slot = 0;
    for (int r = 0; r < size; ++r) {
      const unsigned char* v = views[static_cast<size_t>(r)];
      if (v) {
        srcs[static_cast<size_t>(r)] = v + at;
      } else {
        unsigned char* to = scratch + slot++ * piece * es;
        shm.read_published(r, to, len * es, at, 0);
        srcs[static_cast<size_t>(r)] = to;
      }
    }
    reduce_many(dst + k * es, srcs.data(), size, len, t, op);
    if (op == ReduceOp::avg) divide_by(dst + k * es, len, t, size);
  }
}

// On registered buffers, three barriers whatever the size. Every rank has
// published its input and its output and met the others (the first);
// rank r reduces block r from the peers' inputs into its output, meets them
// again, then copies the other blocks from their owners' outputs. A rank
// that must wait for a late or descheduled peer waits 3 times per call
// instead of twice per chunk.
void allreduce_direct(ShmTransport& shm, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op) {
  const int rank = shm.rank(), size = shm.size();
  const size_t es = size_of(t);
  const size_t po = block_offset(count, size, rank), pc = block_count(count, size, rank);
  auto* out = static_cast<unsigned char*>(recv);
  reduce_block_from_peers(shm, static_cast<const unsigned char*>(send), out + po * es, po, pc, t,
                          op);
  shm.barrier("allreduce");
  for (int s = 1; s < size; ++s) {
    const int j = (rank + s) % size;  // start at different peers: no hot spot
    const size_t bc = block_count(count, size, j), at = block_offset(count, size, j) * es;
    if (bc) shm.read_published(j, out + at, bc * es, at, 1);
  }
  shm.barrier("allreduce");  // nobody reuses its buffers before all have read them
}

void shm_allreduce(ShmTransport& shm, const void* send, void* recv, size_t count, DType t,
                   ReduceOp op) {
  if (count * size_of(t) <= ShmTransport::kSmallBytes)
    return allreduce_small(shm, send, recv, count, t, op);
  const size_t bytes = count * size_of(t);
  if (shm.cma() && bytes > kCmaMinBytes && direct_allreduce()) {
    // Whether every rank's buffers are registered is known only after a
    // barrier; plain ones go on staged (cross-memory attach reads of the
    // inputs measured 2-3x slower than staging them).
    shm.publish(send, bytes, 0);
    shm.publish(recv, bytes, 1);
    shm.barrier("allreduce");
    if (shm.all_published_registered(2)) return allreduce_direct(shm, send, recv, count, t, op);
  }
  reduce_pipeline(shm, send, recv, count, t, op, -1);
}

void shm_reduce(ShmTransport& shm, const void* send, void* recv, size_t count, DType t, ReduceOp op,
                int root) {
  reduce_pipeline(shm, send, recv, count, t, op, root);
}

void shm_broadcast(ShmTransport& shm, void* buf, size_t count, DType t, int root) {
  const int rank = shm.rank();
  const size_t es = size_of(t);
  if (count * es <= ShmTransport::kSmallBytes) {
    const uint64_t parity = shm.next_small_parity();
    if (rank == root) std::memcpy(shm.small_slot(root, parity), buf, count * es);
    shm.barrier("broadcast");
    if (rank != root) std::memcpy(buf, shm.small_slot(root, parity), count * es);
    return;
  }
  // Staged a slot a round, unless the root's buffer is registered: then the
  // others read it in place after the first meeting and meet once more.
  const bool offer = shm.cma() && count * es > kCmaMinBytes;
  if (offer && rank == root) shm.publish(buf, count * es);
  bool direct = offer && rank == root && shm.published_registered(root);
  const size_t per_chunk = shm.chunk_bytes() / es;
  auto* data = static_cast<unsigned char*>(buf);
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t len = std::min(per_chunk, count - off);
    if (rank == root && !direct) std::memcpy(shm.slot(root), data + off * es, len * es);
    shm.barrier("broadcast");
    if (off == 0) direct = offer && shm.published_registered(root);
    if (rank != root) {
      if (!direct)
        std::memcpy(data + off * es, shm.slot(root), len * es);
      else if (off == 0)
        shm.read_published(root, buf, count * es);
    }
    if (direct) break;
    shm.barrier("broadcast");
  }
  if (direct) shm.barrier("broadcast");  // the root keeps its buffer until all have read it
}

}  // namespace

void shm_reduce_scatter(ShmTransport& shm, const void* send, void* recv, size_t count, DType t,
                        ReduceOp op) {
  const int rank = shm.rank(), size = shm.size();
  if (count * size_of(t) <= ShmTransport::kSmallBytes) {
    const uint64_t parity = shm.next_small_parity();
    const size_t es = size_of(t);
    std::memcpy(shm.small_slot(rank, parity), send, count * es);
    shm.barrier("reduce_scatter");
    const size_t off = block_offset(count, size, rank) * es;
    std::vector<const void*> srcs(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) srcs[static_cast<size_t>(r)] = shm.small_slot(r, parity) + off;
    const size_t mine = block_count(count, size, rank);
    reduce_many(recv, srcs.data(), size, mine, t, op);
    if (op == ReduceOp::avg) divide_by(recv, mine, t, size);
    return;
  }
  const size_t es = size_of(t);
  if (shm.cma() && count * es > kCmaMinBytes && direct_allreduce()) {
    // Registered inputs: two barriers whatever the size (allreduce_direct's
    // first half); plain ones go on staged after the first.
    shm.publish(send, count * es, 0);
    shm.barrier("reduce_scatter");
    if (shm.all_published_registered(1)) {
      const size_t po = block_offset(count, size, rank), pc = block_count(count, size, rank);
      reduce_block_from_peers(shm, static_cast<const unsigned char*>(send),
                              static_cast<unsigned char*>(recv), po, pc, t, op);
      shm.barrier("reduce_scatter");  // nobody reuses its input before all have read it
      return;
    }
  }
  // Round k: every rank stages piece k of every block (piece capacity
  // chunk/n); rank r reduces piece k of block r straight into its output.
  const size_t piece = std::max<size_t>(1, shm.chunk_bytes() / es / static_cast<size_t>(size));
  const size_t largest = block_count(count, size, 0);
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  std::vector<const void*> srcs(static_cast<size_t>(size));
  for (size_t k0 = 0; k0 < largest; k0 += piece) {
    for (int j = 0; j < size; ++j) {
      const size_t bc = block_count(count, size, j);
      if (k0 >= bc || j == rank) continue;  // our own piece is read in place
      const size_t len = std::min(piece, bc - k0);
      std::memcpy(shm.slot(rank) + static_cast<size_t>(j) * piece * es,
                  in + (block_offset(count, size, j) + k0) * es, len * es);
    }
    shm.barrier("reduce_scatter");
    const size_t mine = block_count(count, size, rank);
    if (k0 < mine) {
      const size_t len = std::min(piece, mine - k0);
      for (int r = 0; r < size; ++r) {
        srcs[static_cast<size_t>(r)] = r == rank
                                           ? in + (block_offset(count, size, rank) + k0) * es
                                           : shm.slot(r) + static_cast<size_t>(rank) * piece * es;
      }
      reduce_many(out + k0 * es, srcs.data(), size, len, t, op);
      if (op == ReduceOp::avg) divide_by(out + k0 * es, len, t, size);
    }
    shm.barrier("reduce_scatter");
  }
}

void shm_allgather(ShmTransport& shm, const void* send, void* recv, size_t count, DType t) {
  const int rank = shm.rank(), size = shm.size();
  const size_t es = size_of(t);
  if (count * es <= ShmTransport::kSmallBytes) {  // one barrier, alternate small slots
    const uint64_t parity = shm.next_small_parity();
    const size_t mine = block_count(count, size, rank);
    if (mine) std::memcpy(shm.small_slot(rank, parity), send, mine * es);
    shm.barrier("allgather");
    auto* out = static_cast<unsigned char*>(recv);
    for (int j = 0; j < size; ++j) {
      const size_t bc = block_count(count, size, j);
      unsigned char* dst = out + block_offset(count, size, j) * es;
      if (bc && dst != send) std::memcpy(dst, shm.small_slot(j, parity), bc * es);
    }
    return;
  }
  // A slot a round: every rank whose buffer is plain stages its block's
  // piece, meets the others, and each reader copies the plain peers' pieces
  // from their slots. A registered peer's block is read whole from the
  // reader's mapping of it after the first meeting (each reader decides per
  // peer from the publications); where every rank's is registered, the call
  // ends after one more meeting.
  const size_t per_chunk = shm.chunk_bytes() / es;
  const size_t largest = block_count(count, size, 0);
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  const size_t mine = block_count(count, size, rank);
  unsigned char* my_block = out + block_offset(count, size, rank) * es;
  const bool offer = shm.cma() && count * es > kCmaMinBytes;
  if (offer) shm.publish(send, mine * es);
  const bool mine_direct = offer && shm.published_registered(rank);
  bool all_direct = false;
  for (size_t k0 = 0; k0 < largest; k0 += per_chunk) {
    if (!mine_direct && k0 < mine) {
      const size_t len = std::min(per_chunk, mine - k0) * es;
      std::memcpy(shm.slot(rank), in + k0 * es, len);
      // Our own piece from the slot while it is in cache, not from `send` again.
      if (send != my_block) std::memcpy(my_block + k0 * es, shm.slot(rank), len);
    }
    shm.barrier("allgather");
    if (k0 == 0) all_direct = offer && shm.all_published_registered(1);
    for (int s = 1; s < size; ++s) {
      const int j = (rank + s) % size;  // start at different peers: no hot spot
      const size_t bc = block_count(count, size, j);
      unsigned char* dst = out + block_offset(count, size, j) * es;
      if (offer && shm.published_registered(j)) {
        if (k0 == 0 && bc) shm.read_published(j, dst, bc * es);
      } else if (k0 < bc) {
        std::memcpy(dst + k0 * es, shm.slot(j), std::min(per_chunk, bc - k0) * es);
      }
    }
    if (all_direct) break;
    shm.barrier("allgather");  // slots are refilled only after all have read them
  }
  if (mine_direct && send != my_block && mine) std::memcpy(my_block, send, mine * es);
  if (all_direct)
    shm.barrier("allgather");  // nobody reuses its send buffer before all have read it
}

namespace {

void allreduce(Context& ctx, const Call& c) {
  shm_allreduce(ctx.shm(), c.send, c.recv, c.count, c.dtype, c.op);
}

void reduce_scatter(Context& ctx, const Call& c) {
  shm_reduce_scatter(ctx.shm(), c.send, c.recv, c.count, c.dtype, c.op);
}

void allgather(Context& ctx, const Call& c) {
  shm_allgather(ctx.shm(), c.send, c.recv, c.count, c.dtype);
}

void broadcast(Context& ctx, const Call& c) {
  shm_broadcast(ctx.shm(), c.recv, c.count, c.dtype, c.root);
}

void reduce(Context& ctx, const Call& c) {
  shm_reduce(ctx.shm(), c.send, c.recv, c.count, c.dtype, c.op, c.root);
}

// The caller's buffers as given; the reducing ops divide for avg themselves.
constexpr Algorithm registration(Op op, bool averages, void (*run)(Context&, const Call&)) {
  return {
      op,
      Algo::shm,
      "shm",
      "2 barriers per chunk (1 up to 16 KiB; on registered buffers all-reduce 3, reduce-scatter 2)",
      Buffers::caller,
      averages,
      run};
}

constexpr Algorithm kShm[] = {registration(Op::allreduce, true, allreduce),
                              registration(Op::reduce_scatter, true, reduce_scatter),
                              registration(Op::allgather, false, allgather),
                              registration(Op::broadcast, false, broadcast),
                              registration(Op::reduce, true, reduce)};

}  // namespace

std::span<const Algorithm> shm_algorithms() {
  return kShm;
}

}  // namespace anvil::comm::algo
