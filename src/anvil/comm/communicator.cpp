#include "anvil/comm/communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/comm/reduce.hpp"

namespace anvil::comm {
namespace {

void check_op(DType t, ReduceOp op) {
  if (op == ReduceOp::avg && !is_floating(t)) {
    throw InputError("avg needs a floating dtype, got " + to_string(t));
  }
}

void check_root(int root, int size) {
  if (root < 0 || root >= size) {
    throw InputError("--root: expected 0.." + std::to_string(size - 1) + ", got " +
                     std::to_string(root));
  }
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

// A copy of `bytes` of `src` for an in-place algorithm to overwrite.
std::vector<unsigned char> copy_of(const void* src, size_t bytes) {
  const auto* s = static_cast<const unsigned char*>(src);
  return std::vector<unsigned char>(s, s + bytes);
}

}  // namespace

Communicator::Communicator(MPI_Comm comm, int ranks_per_node) : context_(comm, ranks_per_node) {
  if (const char* path = std::getenv("ANVIL_COMM_TUNING")) tuning_ = TuningTable::load(path);
}

Algo Communicator::resolve(Op op, Algo algo, size_t bytes) const {
  return algo == Algo::automatic ? tuning_.pick(op, size(), bytes, single_node()) : algo;
}

void Communicator::barrier() {
  context_.mpi().barrier("barrier");
}

void Communicator::allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                             Algo algo) {
  const size_t bytes = count * size_of(t);
  algo = resolve(Op::allreduce, algo, bytes);
  check_op(t, op);
  const Algorithm& a = find_algorithm(Op::allreduce, algo);
  if (a.buffers == Buffers::in_place) {
    if (send != recv && bytes) std::memcpy(recv, send, bytes);
    send = recv;
  }
  a.run(context_, {.send = send, .recv = recv, .count = count, .dtype = t, .op = op});
  if (op == ReduceOp::avg && !a.averages) divide_by(recv, count, t, size());
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                                  Algo algo) {
  algo = resolve(Op::reduce_scatter, algo, count * size_of(t));
  check_op(t, op);
  const Algorithm& a = find_algorithm(Op::reduce_scatter, algo);
  const size_t es = size_of(t), mine = block_count(count, size(), rank());
  if (a.buffers == Buffers::in_place) {
    // The whole message to reduce in place; this rank's block is the result.
    std::vector<unsigned char> work = copy_of(send, count * es);
    a.run(context_,
          {.send = work.data(), .recv = work.data(), .count = count, .dtype = t, .op = op});
    if (mine) std::memcpy(recv, work.data() + block_offset(count, size(), rank()) * es, mine * es);
  } else {
    a.run(context_, {.send = send, .recv = recv, .count = count, .dtype = t, .op = op});
  }
  if (op == ReduceOp::avg && !a.averages) divide_by(recv, mine, t, size());
}

void Communicator::allgather(const void* send, void* recv, size_t count, DType t, Algo algo) {
  algo = resolve(Op::allgather, algo, count * size_of(t));
  const Algorithm& a = find_algorithm(Op::allgather, algo);
  if (a.buffers == Buffers::in_place) {
    const size_t es = size_of(t), mine = block_count(count, size(), rank());
    auto* my_block = static_cast<unsigned char*>(recv) + block_offset(count, size(), rank()) * es;
    if (send != my_block && mine) std::memcpy(my_block, send, mine * es);
    send = recv;
  }
  a.run(context_, {.send = send, .recv = recv, .count = count, .dtype = t});
}

void Communicator::broadcast(void* buf, size_t count, DType t, int root, Algo algo) {
  algo = resolve(Op::broadcast, algo, count * size_of(t));
  check_root(root, size());
  find_algorithm(Op::broadcast, algo)
      .run(context_, {.send = buf, .recv = buf, .count = count, .dtype = t, .root = root});
}

void Communicator::reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                          int root, Algo algo) {
  algo = resolve(Op::reduce, algo, count * size_of(t));
  check_op(t, op);
  check_root(root, size());
  const Algorithm& a = find_algorithm(Op::reduce, algo);
  const size_t bytes = count * size_of(t);
  if (a.buffers == Buffers::in_place) {
    // Every rank's input is overwritten on the way; the root's ends as the result.
    std::vector<unsigned char> acc = copy_of(send, bytes);
    a.run(context_, {.send = acc.data(),
                     .recv = acc.data(),
                     .count = count,
                     .dtype = t,
                     .op = op,
                     .root = root});
    if (rank() == root && bytes) std::memcpy(recv, acc.data(), bytes);
  } else {
    a.run(context_,
          {.send = send, .recv = recv, .count = count, .dtype = t, .op = op, .root = root});
  }
  if (op == ReduceOp::avg && !a.averages && rank() == root) divide_by(recv, count, t, size());
}

void Communicator::alltoall(const void* send, void* recv, size_t count, DType t, Algo algo) {
  const size_t n = static_cast<size_t>(size());
  algo = resolve(Op::alltoall, algo, count * size_of(t) * n);
  std::vector<size_t> counts(n, count), offsets(n);
  for (size_t r = 0; r < n; ++r) offsets[r] = r * count;
  alltoallv(send, counts.data(), offsets.data(), recv, counts.data(), offsets.data(), t, algo);
}

void Communicator::alltoallv(const void* send, const size_t* send_counts,
                             const size_t* send_offsets, void* recv, const size_t* recv_counts,
                             const size_t* recv_offsets, DType t, Algo algo) {
  // Per-rank counts differ, so auto decides by the rank count alone: every
  // rank must pick the same algorithm.
  algo = resolve(Op::alltoall, algo, 0);
  const size_t es = size_of(t);
  size_t send_extent = 0, recv_extent = 0;
  for (int r = 0; r < size(); ++r) {
    send_extent = std::max(send_extent, send_offsets[r] + send_counts[r]);
    recv_extent = std::max(recv_extent, recv_offsets[r] + recv_counts[r]);
  }
  // In place: stage the input, then every algorithm sees separate buffers.
  std::vector<unsigned char> staged;
  if (overlaps(send, send_extent * es, recv, recv_extent * es)) {
    staged = copy_of(send, send_extent * es);
    send = staged.data();
  }
  find_algorithm(Op::alltoall, algo)
      .run(context_, {.send = send,
                      .recv = recv,
                      .dtype = t,
                      .send_counts = send_counts,
                      .send_offsets = send_offsets,
                      .recv_counts = recv_counts,
                      .recv_offsets = recv_offsets});
}

}  // namespace anvil::comm
