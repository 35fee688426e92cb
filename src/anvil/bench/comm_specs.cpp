#include "anvil/bench/comm_specs.hpp"

#include <stdexcept>
#include <string>

#include "anvil/comm/check.hpp"

namespace anvil::bench {
namespace {

using comm::Algo;
using comm::Op;

double all_reducing(int n) {
  return 2.0 * (n - 1) / n;
}
double each_sends_its_share(int n) {
  return static_cast<double>(n - 1) / n;
}
double whole_message(int) {
  return 1.0;
}

size_t my_offset(const CommCase& c) {
  return comm::block_offset(c.count, c.comm.size(), c.comm.rank());
}
size_t my_count(const CommCase& c) {
  return comm::block_count(c.count, c.comm.size(), c.comm.rank());
}
size_t elem_size(const CommCase& c) {
  return comm::size_of(c.dtype);
}

// Where a result lands when the op's in-place layout puts it in send.
unsigned char* result(const CommCase& c) {
  return c.in_place ? c.send : c.recv;
}

// Elements i in [first, last) of `res` (counted from `first`) that differ from expected(i).
template <typename Expected>
int64_t mismatches(const void* res, size_t first, size_t last, comm::DType t, Expected expected) {
  int64_t wrong = 0;
  for (size_t i = first; i < last; ++i) wrong += comm::check::get(res, i - first, t) != expected(i);
  return wrong;
}

// Rank r's input is the pattern vector of rank r (all-reduce, reduce-scatter, reduce).
void fill_own_pattern(const CommCase& c) {
  for (size_t i = 0; i < c.count; ++i)
    comm::check::put(c.send, i, c.dtype, comm::check::value(c.comm.rank(), i));
}

// The reduction over all ranks of element i.
auto reduced(const CommCase& c) {
  return [&c](size_t i) { return comm::check::expected(i, c.comm.size(), c.dtype, c.redop); };
}

void run_allreduce(const CommCase& c, Algo a) {
  c.comm.allreduce(c.send, result(c), c.count, c.dtype, c.redop, a);
}
int64_t wrong_allreduce(const CommCase& c) {
  return mismatches(result(c), 0, c.count, c.dtype, reduced(c));
}

void run_reduce_scatter(const CommCase& c, Algo a) {
  void* recv = c.in_place ? c.send + my_offset(c) * elem_size(c) : c.recv;
  c.comm.reduce_scatter(c.send, recv, c.count, c.dtype, c.redop, a);
}
int64_t wrong_reduce_scatter(const CommCase& c) {
  const size_t off = my_offset(c);
  const unsigned char* res = c.in_place ? c.send + off * elem_size(c) : c.recv;
  return mismatches(res, off, off + my_count(c), c.dtype, reduced(c));
}

// Rank r contributes block r of the pattern vector of rank r.
void fill_allgather(const CommCase& c) {
  const size_t off = my_offset(c);
  unsigned char* dst = c.in_place ? c.recv + off * elem_size(c) : c.send;
  for (size_t i = 0; i < my_count(c); ++i)
    comm::check::put(dst, i, c.dtype, comm::check::value(c.comm.rank(), off + i));
}
void run_allgather(const CommCase& c, Algo a) {
  const void* in = c.in_place ? c.recv + my_offset(c) * elem_size(c) : c.send;
  c.comm.allgather(in, c.recv, c.count, c.dtype, a);
}
int64_t wrong_allgather(const CommCase& c) {
  int64_t wrong = 0;
  for (int q = 0; q < c.comm.size(); ++q) {
    const size_t off = comm::block_offset(c.count, c.comm.size(), q);
    wrong += mismatches(c.recv + off * elem_size(c), off,
                        off + comm::block_count(c.count, c.comm.size(), q), c.dtype,
                        [q](size_t i) { return comm::check::value(q, i); });
  }
  return wrong;
}

// The root holds its pattern; the others a different one, to be overwritten.
void fill_broadcast(const CommCase& c) {
  const int from = c.comm.rank() == c.root ? c.root : c.root + 1;
  for (size_t i = 0; i < c.count; ++i)
    comm::check::put(c.send, i, c.dtype, comm::check::value(from, i));
}
void run_broadcast(const CommCase& c, Algo a) {
  c.comm.broadcast(c.send, c.count, c.dtype, c.root, a);
}
int64_t wrong_broadcast(const CommCase& c) {
  return mismatches(c.send, 0, c.count, c.dtype,
                    [&c](size_t i) { return comm::check::value(c.root, i); });
}

void run_reduce(const CommCase& c, Algo a) {
  c.comm.reduce(c.send, result(c), c.count, c.dtype, c.redop, c.root, a);
}
int64_t wrong_reduce(const CommCase& c) {
  if (c.comm.rank() != c.root) return 0;
  return mismatches(result(c), 0, c.count, c.dtype, reduced(c));
}

// Element j of the block rank r sends to rank q encodes (r, q, j).
void fill_alltoall(const CommCase& c) {
  for (int q = 0; q < c.comm.size(); ++q)
    for (size_t j = 0; j < c.count; ++j)
      comm::check::put(c.send, static_cast<size_t>(q) * c.count + j, c.dtype,
                       comm::check::alltoall_value(c.comm.rank(), q, j));
}
void run_alltoall(const CommCase& c, Algo a) {
  c.comm.alltoall(c.send, result(c), c.count, c.dtype, a);
}
int64_t wrong_alltoall(const CommCase& c) {
  int64_t wrong = 0;
  for (int q = 0; q < c.comm.size(); ++q) {
    const size_t first = static_cast<size_t>(q) * c.count;
    wrong += mismatches(result(c) + first * elem_size(c), first, first + c.count, c.dtype,
                        [&c, q, first](size_t i) {
                          return comm::check::alltoall_value(q, c.comm.rank(), i - first);
                        });
  }
  return wrong;
}

// A table, one entry per collective (aligned by hand).
// clang-format off
constexpr CollectiveSpec kSpecs[] = {
    {.op = Op::allreduce,      .reduces = true,                 .bus_factor = all_reducing,
     .fill = fill_own_pattern, .run = run_allreduce,            .wrong = wrong_allreduce},
    {.op = Op::reduce_scatter, .reduces = true,                 .bus_factor = each_sends_its_share,
     .fill = fill_own_pattern, .run = run_reduce_scatter,       .wrong = wrong_reduce_scatter},
    {.op = Op::allgather,                                       .bus_factor = each_sends_its_share,
     .fill = fill_allgather,   .run = run_allgather,            .wrong = wrong_allgather},
    {.op = Op::broadcast,      .rooted = true,                  .bus_factor = whole_message,
     .fill = fill_broadcast,   .run = run_broadcast,            .wrong = wrong_broadcast},
    {.op = Op::reduce,         .reduces = true, .rooted = true, .bus_factor = whole_message,
     .fill = fill_own_pattern, .run = run_reduce,               .wrong = wrong_reduce},
    {.op = Op::alltoall,       .per_peer = true,                .bus_factor = each_sends_its_share,
     .fill = fill_alltoall,    .run = run_alltoall,             .wrong = wrong_alltoall}};
// clang-format on

}  // namespace

std::span<const CollectiveSpec> collective_specs() {
  return kSpecs;
}

const CollectiveSpec& spec_for(comm::Op op) {
  for (const CollectiveSpec& s : kSpecs) {
    if (s.op == op) return s;
  }
  throw std::logic_error("bench comm: no spec for " + comm::to_string(op));
}

}  // namespace anvil::bench
