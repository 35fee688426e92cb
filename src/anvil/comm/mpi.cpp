// The MPI library's own collectives, registered as the algorithm "mpi": the
// baseline every other algorithm is measured against, so they are called
// as they are, blocking and under the transport's watchdog. MPI has no
// bf16: it travels as 16-bit words with user-defined operators that widen
// to fp32, combine and round.
#include <array>
#include <utility>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/comm/context.hpp"
#include "anvil/comm/families.hpp"

namespace anvil::comm::algo {
namespace {

template <typename F>
void bf16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(F{}(to_float(a[i]), to_float(b[i])));
}
struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return a < b ? b : a; }
};
struct Min {
  float operator()(float a, float b) const { return b < a ? b : a; }
};

MPI_Datatype mpi_type(DType t) {
  // bf16 travels as 16-bit words, combined by the bf16 ops below.
  const std::pair<DType, MPI_Datatype> types[] = {{DType::f32, MPI_FLOAT},
                                                  {DType::bf16, MPI_UINT16_T},
                                                  {DType::f64, MPI_DOUBLE},
                                                  {DType::i32, MPI_INT32_T},
                                                  {DType::i64, MPI_INT64_T}};
  for (const auto& [dtype, type] : types) {
    if (dtype == t) return type;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  if (t == DType::bf16) {
    // Created once per process, on first use, and never changed after.
    static const std::array<MPI_Op, 3> ops = [] {
      std::array<MPI_Op, 3> o{};
      MPI_Op_create(&bf16_op<Add>, 1, &o[0]);
      MPI_Op_create(&bf16_op<Max>, 1, &o[1]);
      MPI_Op_create(&bf16_op<Min>, 1, &o[2]);
      return o;
    }();
    return op == ReduceOp::max ? ops[1] : op == ReduceOp::min ? ops[2] : ops[0];
  }
  return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

void allreduce(Context& ctx, const Call& c) {
  MpiTransport& mpi = ctx.mpi();
  mpi.blocking("allreduce(mpi)", [&] {
    MPI_Allreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, mpi_count(c.count),
                  mpi_type(c.dtype), mpi_op(c.dtype, c.op), mpi.mpi_comm());
  });
}

void reduce_scatter(Context& ctx, const Call& c) {
  MpiTransport& mpi = ctx.mpi();
  const int n = mpi.size();
  const size_t es = size_of(c.dtype), mine = block_count(c.count, n, mpi.rank());
  std::vector<int> counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    counts[static_cast<size_t>(r)] = mpi_count(block_count(c.count, n, r));
  // In place (recv inside send) is not MPI's in-place layout: stage a copy.
  std::vector<unsigned char> staged;
  const void* in = c.send;
  if (overlaps(c.send, c.count * es, c.recv, mine * es)) {
    staged.assign(static_cast<const unsigned char*>(c.send),
                  static_cast<const unsigned char*>(c.send) + c.count * es);
    in = staged.data();
  }
  mpi.blocking("reduce_scatter(mpi)", [&] {
    MPI_Reduce_scatter(in, c.recv, counts.data(), mpi_type(c.dtype), mpi_op(c.dtype, c.op),
                       mpi.mpi_comm());
  });
}

void allgather(Context& ctx, const Call& c) {
  MpiTransport& mpi = ctx.mpi();
  const int n = mpi.size(), rank = mpi.rank();
  const auto* my_block =
      static_cast<unsigned char*>(c.recv) + block_offset(c.count, n, rank) * size_of(c.dtype);
  std::vector<int> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    counts[static_cast<size_t>(r)] = mpi_count(block_count(c.count, n, r));
    displs[static_cast<size_t>(r)] = mpi_count(block_offset(c.count, n, r));
  }
  mpi.blocking("allgather(mpi)", [&] {
    MPI_Allgatherv(c.send == my_block ? MPI_IN_PLACE : c.send, counts[static_cast<size_t>(rank)],
                   mpi_type(c.dtype), c.recv, counts.data(), displs.data(), mpi_type(c.dtype),
                   mpi.mpi_comm());
  });
}

void broadcast(Context& ctx, const Call& c) {
  MpiTransport& mpi = ctx.mpi();
  mpi.blocking("broadcast(mpi)", [&] {
    MPI_Bcast(c.recv, mpi_count(c.count), mpi_type(c.dtype), c.root, mpi.mpi_comm());
  });
}

void reduce(Context& ctx, const Call& c) {
  MpiTransport& mpi = ctx.mpi();
  const bool in_place = mpi.rank() == c.root && c.send == c.recv;
  mpi.blocking("reduce(mpi)", [&] {
    MPI_Reduce(in_place ? MPI_IN_PLACE : c.send, c.recv, mpi_count(c.count), mpi_type(c.dtype),
               mpi_op(c.dtype, c.op), c.root, mpi.mpi_comm());
  });
}

void alltoallv(Context& ctx, const Call& c) {
  MpiTransport& mpi = ctx.mpi();
  std::vector<int> sc(static_cast<size_t>(mpi.size())), so(sc), rc(sc), ro(sc);
  for (size_t r = 0; r < static_cast<size_t>(mpi.size()); ++r) {
    sc[r] = mpi_count(c.send_counts[r]);
    so[r] = mpi_count(c.send_offsets[r]);
    rc[r] = mpi_count(c.recv_counts[r]);
    ro[r] = mpi_count(c.recv_offsets[r]);
  }
  mpi.blocking("alltoall(mpi)", [&] {
    MPI_Alltoallv(c.send, sc.data(), so.data(), mpi_type(c.dtype), c.recv, rc.data(), ro.data(),
                  mpi_type(c.dtype), mpi.mpi_comm());
  });
}

// Every op the same way: the caller's buffers, avg divided by Communicator.
constexpr Algorithm registration(Op op, void (*run)(Context&, const Call&)) {
  return {op, Algo::mpi, "mpi", "the library's choice", Buffers::caller, false, run};
}

constexpr Algorithm kMpi[] = {
    registration(Op::allreduce, allreduce), registration(Op::reduce_scatter, reduce_scatter),
    registration(Op::allgather, allgather), registration(Op::broadcast, broadcast),
    registration(Op::reduce, reduce),       registration(Op::alltoall, alltoallv)};

}  // namespace

std::span<const Algorithm> mpi_algorithms() {
  return kMpi;
}

}  // namespace anvil::comm::algo
