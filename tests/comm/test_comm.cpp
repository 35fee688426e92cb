// Every op x algorithm x dtype x reduce-op against its exact expected result,
// for whatever rank count mpirun gives (CTest runs 1..8): counts 0, 1, primes,
// counts not divisible by the rank count, in place and out of place, every
// root. Input values are small integers, so every reduction order gives the
// same exact answer in every dtype (bf16 included).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/shared_buffer.hpp"
#include "anvil/comm/async.hpp"
#include "anvil/comm/check.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/comm/shm_transport.hpp"

namespace anvil::comm {
namespace {

Communicator* g_comm = nullptr;

using check::expected;
using check::value;

void put(std::vector<unsigned char>& buf, size_t i, DType t, double v) {
  check::put(buf.data(), i, t, v);
}
double get(const std::vector<unsigned char>& buf, size_t i, DType t) {
  return check::get(buf.data(), i, t);
}

std::vector<unsigned char> filled(size_t count, DType t, int r) {
  std::vector<unsigned char> b(count * size_of(t) + 1);
  for (size_t i = 0; i < count; ++i) put(b, i, t, value(r, i));
  return b;
}

std::vector<size_t> counts_for(int n) {
  // 0, 1, primes, and counts around multiples of n (not divisible by it).
  return {0, 1, 2, 7, 13, 97, static_cast<size_t>(n) * 5 + 1, 1031, 65537};
}

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64};

std::vector<ReduceOp> ops_for(DType t) {
  if (is_floating(t)) return {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg};
  return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
}

std::string label(Op op, Algo a, DType t, size_t count, bool in_place,
                  const std::string& more = "") {
  std::ostringstream s;
  s << to_string(op) << "(" << to_string(a) << ") " << to_string(t) << " count=" << count
    << (in_place ? " in-place" : "") << more << " on " << g_comm->size() << " ranks, rank "
    << g_comm->rank();
  return s.str();
}

TEST(Collectives, AllreduceExact) {
  Communicator& c = *g_comm;
  for (Algo a : algorithms_for(Op::allreduce)) {
    for (DType t : kDtypes) {
      for (ReduceOp rop : ops_for(t)) {
        for (size_t count : counts_for(c.size())) {
          for (bool in_place : {false, true}) {
            auto send = filled(count, t, c.rank());
            std::vector<unsigned char> out(send.size());
            void* recv = in_place ? send.data() : out.data();
            c.allreduce(send.data(), recv, count, t, rop, a);
            const auto& res = in_place ? send : out;
            size_t wrong = 0;
            for (size_t i = 0; i < count; ++i)
              wrong += get(res, i, t) != expected(i, c.size(), t, rop);
            EXPECT_EQ(wrong, 0u) << label(Op::allreduce, a, t, count, in_place,
                                          " " + to_string(rop));
          }
        }
      }
    }
  }
}

TEST(Collectives, HierarchicalAllreduceOnSimulatedNodesExact) {
  const int n = g_comm->size();
  for (int rpn = 1; rpn <= n; ++rpn) {
    if (n % rpn != 0) continue;
    Communicator sim(MPI_COMM_WORLD, rpn);
    sim.set_timeout(120);
    for (DType t : kDtypes) {
      for (ReduceOp rop : ops_for(t)) {
        for (size_t count : counts_for(n)) {
          auto buf = filled(count, t, sim.rank());
          sim.allreduce(buf.data(), buf.data(), count, t, rop, Algo::hier);
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) wrong += get(buf, i, t) != expected(i, n, t, rop);
          EXPECT_EQ(wrong, 0u) << label(
              Op::allreduce, Algo::hier, t, count, true,
              " " + to_string(rop) + " ranks_per_node=" + std::to_string(rpn));
        }
      }
    }
  }
}

TEST(Collectives, HierarchicalRejectsRanksPerNodeThatDoNotDivide) {
  const int n = g_comm->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator sim(MPI_COMM_WORLD, n + 1);
  float x = 1.0f;
  EXPECT_THROW(sim.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::hier), InputError);
}

TEST(Collectives, SharedMemoryLeavesNoNameBehind) {
  // The segment is unlinked as soon as every rank has mapped it: nothing in
  // /dev/shm can outlive the job, however it ends.
  Communicator& c = *g_comm;
  float x = 1.0f;
  c.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::shm);
  const std::string name = c.shm().name();
  EXPECT_EQ(name.rfind("/anvil-", 0), 0u) << name;
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name)) << name;
}

TEST(Collectives, StaleSegmentsOfDeadJobsAreRemoved) {
  // A name as a killed job would leave it: pid 0x7fffffff cannot be alive.
  const char* stale = "/anvil-2147483646-deadbeef";
  if (g_comm->rank() == 0) {
    const int fd = ::shm_open(stale, O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  Communicator fresh(MPI_COMM_WORLD);
  float x = 1.0f;
  fresh.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::shm);
  EXPECT_EQ(x, static_cast<float>(g_comm->size()));
  EXPECT_FALSE(std::filesystem::exists(std::string("/dev/shm") + stale));
}

TEST(Tuning, AutoPicksTheTableRowThenTheBuiltInRule) {
  TuningTable t;
  t.rows = {{Op::allreduce, 4, 1024, Algo::rhd}, {Op::allreduce, 4, int64_t{1} << 40, Algo::shm}};
  EXPECT_EQ(t.pick(Op::allreduce, 4, 100, true), Algo::rhd);
  EXPECT_EQ(t.pick(Op::allreduce, 4, 4096, true), Algo::shm);
  EXPECT_EQ(t.pick(Op::allreduce, 4, 4096, false), Algo::hier);  // shm row needs one node
  EXPECT_EQ(t.pick(Op::allreduce, 2, 100, true), Algo::shm);     // no row for 2 ranks
  EXPECT_EQ(t.pick(Op::alltoall, 4, 100, true), Algo::mpi);
  EXPECT_EQ(t.pick(Op::broadcast, 4, 100, false), Algo::mpi);
}

TEST(Tuning, TableFileRoundTripAndErrors) {
  TuningTable t;
  t.rows = {{Op::reduce_scatter, 2, 4096, Algo::ring}, {Op::reduce_scatter, 2, 1 << 30, Algo::shm}};
  const std::string path = "/tmp/anvil-tuning-" + std::to_string(::getpid()) + "-" +
                           std::to_string(g_comm->rank()) + ".json";
  t.save(path);
  const TuningTable back = TuningTable::load(path);
  ASSERT_EQ(back.rows.size(), 2u);
  EXPECT_EQ(back.rows[0].algo, Algo::ring);
  EXPECT_EQ(back.rows[1].max_bytes, 1 << 30);
  // A rank count or size that is not an integer in range is refused, not cast.
  write_file_atomic(path, R"({"format": "anvil-comm-tuning", "rows": [
      {"op": "allreduce", "ranks": 1e33, "max_bytes": 64, "algo": "ring"}]})");
  try {
    TuningTable::load(path);
    ADD_FAILURE() << "a float rank count was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rows[0].ranks: expected an integer in [1, 1048576]"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(TuningTable::load("/nonexistent/tuning.json"), InputError);
}

TEST(Collectives, ReduceScatterExact) {
  Communicator& c = *g_comm;
  const int n = c.size(), r = c.rank();
  for (Algo a : algorithms_for(Op::reduce_scatter)) {
    for (DType t : kDtypes) {
      for (ReduceOp rop : ops_for(t)) {
        for (size_t count : counts_for(n)) {
          for (bool in_place : {false, true}) {
            auto send = filled(count, t, r);
            const size_t es = size_of(t), mine = block_count(count, n, r),
                         off = block_offset(count, n, r);
            std::vector<unsigned char> out(mine * es + 1);
            void* recv = in_place ? send.data() + off * es : out.data();
            c.reduce_scatter(send.data(), recv, count, t, rop, a);
            std::vector<unsigned char> res(mine * es + 1);
            std::memcpy(res.data(), recv, mine * es);
            size_t wrong = 0;
            for (size_t i = 0; i < mine; ++i)
              wrong += get(res, i, t) != expected(off + i, n, t, rop);
            EXPECT_EQ(wrong, 0u) << label(Op::reduce_scatter, a, t, count, in_place,
                                          " " + to_string(rop));
          }
        }
      }
    }
  }
}

TEST(Collectives, AllgatherExact) {
  Communicator& c = *g_comm;
  const int n = c.size(), r = c.rank();
  for (Algo a : algorithms_for(Op::allgather)) {
    for (DType t : kDtypes) {
      for (size_t count : counts_for(n)) {
        for (bool in_place : {false, true}) {
          // Rank q contributes block q of the vector value(q, i).
          const size_t es = size_of(t), mine = block_count(count, n, r),
                       off = block_offset(count, n, r);
          std::vector<unsigned char> out(count * es + 1, 0xAB);
          std::vector<unsigned char> mine_buf(mine * es + 1);
          for (size_t i = 0; i < mine; ++i) put(mine_buf, i, t, value(r, off + i));
          if (in_place) std::memcpy(out.data() + off * es, mine_buf.data(), mine * es);
          c.allgather(in_place ? out.data() + off * es : mine_buf.data(), out.data(), count, t, a);
          size_t wrong = 0;
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < block_count(count, n, q); ++i) {
              const size_t g = block_offset(count, n, q) + i;
              wrong += get(out, g, t) != value(q, g);
            }
          }
          EXPECT_EQ(wrong, 0u) << label(Op::allgather, a, t, count, in_place);
        }
      }
    }
  }
}

TEST(Collectives, BroadcastEveryRootExact) {
  Communicator& c = *g_comm;
  for (Algo a : algorithms_for(Op::broadcast)) {
    for (DType t : kDtypes) {
      for (size_t count : counts_for(c.size())) {
        for (int root = 0; root < c.size(); ++root) {
          auto buf = filled(count, t, c.rank() == root ? root : root + 1);
          c.broadcast(buf.data(), count, t, root, a);
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) wrong += get(buf, i, t) != value(root, i);
          EXPECT_EQ(wrong, 0u) << label(Op::broadcast, a, t, count, true,
                                        " root=" + std::to_string(root));
        }
      }
    }
  }
}

TEST(Collectives, ReduceEveryRootExact) {
  Communicator& c = *g_comm;
  for (Algo a : algorithms_for(Op::reduce)) {
    for (DType t : kDtypes) {
      for (ReduceOp rop : ops_for(t)) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{1031}}) {
          for (int root = 0; root < c.size(); ++root) {
            for (bool in_place : {false, true}) {
              auto send = filled(count, t, c.rank());
              std::vector<unsigned char> out(send.size());
              void* recv = in_place && c.rank() == root ? send.data() : out.data();
              c.reduce(send.data(), recv, count, t, rop, root, a);
              if (c.rank() != root) continue;
              const auto& res = recv == send.data() ? send : out;
              size_t wrong = 0;
              for (size_t i = 0; i < count; ++i)
                wrong += get(res, i, t) != expected(i, c.size(), t, rop);
              EXPECT_EQ(wrong, 0u)
                  << label(Op::reduce, a, t, count, in_place,
                           std::string(" ") + to_string(rop) + " root=" + std::to_string(root));
            }
          }
        }
      }
    }
  }
}

TEST(Collectives, AlltoallAndAlltoallvExact) {
  Communicator& c = *g_comm;
  const int n = c.size(), r = c.rank();
  for (Algo a : algorithms_for(Op::alltoall)) {
    for (DType t : kDtypes) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}}) {
        for (bool in_place : {false, true}) {
          // Element j of the block for peer q on rank r encodes (r, q, j).
          const size_t es = size_of(t), total = count * static_cast<size_t>(n);
          std::vector<unsigned char> send(total * es + 1), out(total * es + 1);
          for (int q = 0; q < n; ++q)
            for (size_t j = 0; j < count; ++j)
              put(send, q * count + j, t, check::alltoall_value(r, q, j));
          void* recv = in_place ? send.data() : out.data();
          c.alltoall(send.data(), recv, count, t, a);
          std::vector<unsigned char> res(total * es + 1);
          std::memcpy(res.data(), recv, total * es);
          size_t wrong = 0;
          for (int q = 0; q < n; ++q)
            for (size_t j = 0; j < count; ++j)
              wrong += get(res, q * count + j, t) != check::alltoall_value(q, r, j);
          EXPECT_EQ(wrong, 0u) << label(Op::alltoall, a, t, count, in_place);
        }
      }
      // alltoallv: rank r sends (r + q) % 3 + q elements to peer q.
      std::vector<size_t> sc(n), so(n), rc(n), ro(n);
      size_t st = 0, rt = 0;
      for (int q = 0; q < n; ++q) {
        sc[q] = static_cast<size_t>((r + q) % 3 + q);
        so[q] = st;
        st += sc[q];
        rc[q] = static_cast<size_t>((q + r) % 3 + r);
        ro[q] = rt;
        rt += rc[q];
      }
      std::vector<unsigned char> send(st * size_of(t) + 1), recv(rt * size_of(t) + 1);
      for (int q = 0; q < n; ++q)
        for (size_t j = 0; j < sc[q]; ++j) put(send, so[q] + j, t, r * 10 + static_cast<double>(j));
      c.alltoallv(send.data(), sc.data(), so.data(), recv.data(), rc.data(), ro.data(), t, a);
      size_t wrong = 0;
      for (int q = 0; q < n; ++q)
        for (size_t j = 0; j < rc[q]; ++j)
          wrong += get(recv, ro[q] + j, t) != q * 10 + static_cast<double>(j);
      EXPECT_EQ(wrong, 0u) << label(Op::alltoall, a, t, rt, false, " (v)");
    }
  }
}

TEST(Collectives, LargeMessagesOver64MiB) {
  Communicator& c = *g_comm;
  const size_t count = (size_t{64} << 20) / 4 + 3;  // > 64 MiB of f32, odd
  for (Algo a : algorithms_for(Op::allreduce)) {
    auto buf = filled(count, DType::f32, c.rank());
    c.allreduce(buf.data(), buf.data(), count, DType::f32, ReduceOp::sum, a);
    size_t wrong = 0;
    for (size_t i = 0; i < count; i += 1)
      wrong += get(buf, i, DType::f32) != expected(i, c.size(), DType::f32, ReduceOp::sum);
    EXPECT_EQ(wrong, 0u) << label(Op::allreduce, a, DType::f32, count, true);
  }
  for (Algo a : algorithms_for(Op::allgather)) {
    const int n = c.size(), r = c.rank();
    const size_t mine = block_count(count, n, r), off = block_offset(count, n, r);
    std::vector<float> out(count);
    for (size_t i = 0; i < mine; ++i) out[off + i] = static_cast<float>(value(r, off + i));
    c.allgather(out.data() + off, out.data(), count, DType::f32, a);
    size_t wrong = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = block_offset(count, n, q);
           i < block_offset(count, n, q) + block_count(count, n, q); ++i)
        wrong += out[i] != value(q, i);
    EXPECT_EQ(wrong, 0u) << label(Op::allgather, a, DType::f32, count, true);
  }
}

// ANVIL_SHM_DIRECT=0 (a CTest variant): registered buffers are read by
// cross-memory attach, not through mappings.
bool mappings_allowed() {
  const char* e = std::getenv("ANVIL_SHM_DIRECT");
  return !(e && std::string(e) == "0");
}

// A buffer of `bytes`: registered (a SharedBuffer) or plain memory.
struct TestBuffer {
  TestBuffer(size_t bytes, bool shared) {
    if (shared)
      region = std::make_unique<SharedBuffer>(bytes, "test buffer");
    else
      plain.resize(bytes);
  }
  unsigned char* data() { return region ? region->data() : plain.data(); }
  std::unique_ptr<SharedBuffer> region;
  std::vector<unsigned char> plain;
};

// Every algorithm's all-gather (in place and out of place) and broadcast
// (every root) of `count` f32 elements, on new buffers (registered where
// `shared`) with the data `pad` elements into them.
void allgather_and_broadcast_cases(size_t count, bool shared, const std::string& tag) {
  Communicator& c = *g_comm;
  const int n = c.size(), r = c.rank();
  const DType t = DType::f32;
  const size_t es = size_of(t), pad = 40;
  for (bool in_place : {false, true}) {
    for (Algo a : algorithms_for(Op::allgather)) {
      TestBuffer send((count + 2 * pad) * es, shared), recv((count + 2 * pad) * es, shared);
      const size_t mine = block_count(count, n, r), off = block_offset(count, n, r);
      auto* out = recv.data() + pad * es;
      auto* in = in_place ? out + off * es : send.data() + pad * es;
      for (size_t i = 0; i < mine; ++i) check::put(in, i, t, value(r, off + i));
      c.allgather(in, out, count, t, a);
      size_t wrong = 0;
      for (int q = 0; q < n; ++q)
        for (size_t g = block_offset(count, n, q);
             g < block_offset(count, n, q) + block_count(count, n, q); ++g)
          wrong += check::get(out, g, t) != value(q, g);
      EXPECT_EQ(wrong, 0u) << label(Op::allgather, a, t, count, in_place, tag);
    }
  }
  for (Algo a : algorithms_for(Op::broadcast)) {
    for (int root = 0; root < n; ++root) {
      TestBuffer buf((count + pad) * es, shared);
      auto* data = buf.data() + pad * es;
      for (size_t i = 0; i < count; ++i)
        check::put(data, i, t, value(r == root ? root : root + 1, i));
      c.broadcast(data, count, t, root, a);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += check::get(data, i, t) != value(root, i);
      EXPECT_EQ(wrong, 0u) << label(Op::broadcast, a, t, count, true,
                                    tag + " root=" + std::to_string(root));
    }
  }
}

// Registered buffers (SharedBuffer): the shared-memory all-gather and
// broadcast read the peers' buffers through their own mappings of them.
// Buffers at an offset inside the region, a new pair each round (more rounds
// than the mappings kept per peer), in place and out of place; every
// algorithm gets the same buffers. Without cross-memory attach
// (ANVIL_SHM_CMA=0, a CTest variant) the staged copies run instead.
TEST(Collectives, RegisteredBuffersAllgatherAndBroadcastExact) {
  Communicator& c = *g_comm;
  const uint64_t direct_before = c.shm().direct_reads();
  for (size_t count : {size_t{1031}, size_t{65537}, size_t{300007}})
    allgather_and_broadcast_cases(count, true, " registered");
  // Where cross-memory attach works, mappings are allowed and more than one
  // rank runs, the large messages were read through mappings.
  if (c.size() > 1 && c.shm().cma() && mappings_allowed()) {
    EXPECT_GT(c.shm().direct_reads(), direct_before);
  }
}

// Odd ranks pass registered buffers, even ranks plain ones: each reader
// takes every peer's block the way that peer's buffer allows (staged for a
// plain one, in place for a registered one), for messages that fit one
// staging slot and for larger ones.
TEST(Collectives, MixedRegisteredAndPlainBuffersAllgatherAndBroadcastExact) {
  for (size_t count : {size_t{65537}, size_t{200003}, size_t{300007}, size_t{1000003}})
    allgather_and_broadcast_cases(count, g_comm->rank() % 2 == 1, " mixed");
}

// The cases of the registered-buffer reductions: every dtype and op, sizes
// below and above 64 KiB, in place and out of place, each on every
// algorithm of `op` with buffers at an offset in their regions. The staged
// paths read no published buffer, so the shm direct reads counted across
// the cases are the direct paths' (where cross-memory attach and mappings
// are allowed).
template <class Run>
void registered_cases(Op op, const Run& run) {
  Communicator& c = *g_comm;
  const uint64_t direct_before = c.shm().direct_reads();
  for (DType t : kDtypes)
    for (ReduceOp rop : ops_for(t))
      for (size_t count : {size_t{1031}, size_t{65537}, size_t{300007}})
        for (bool in_place : {false, true})
          for (Algo a : algorithms_for(op)) {
            const size_t wrong = run(t, rop, count, in_place, a);
            EXPECT_EQ(wrong, 0u) << label(op, a, t, count, in_place,
                                          " " + to_string(rop) + " registered");
          }
  if (c.size() > 1 && c.shm().cma() && mappings_allowed()) {
    EXPECT_GT(c.shm().direct_reads(), direct_before);
  }
}

constexpr size_t kPad = 24;  // elements before and after the data in its region

// All-reduce: above 64 KiB the shared-memory one reduces each block straight
// from the peers' mappings (3 barriers); a plain buffer on the same call
// sizes runs staged.
TEST(Collectives, RegisteredBuffersAllreduceExact) {
  const int n = g_comm->size(), r = g_comm->rank();
  registered_cases(Op::allreduce, [&](DType t, ReduceOp rop, size_t count, bool in_place, Algo a) {
    const size_t es = size_of(t);
    SharedBuffer send((count + 2 * kPad) * es, "test send"),
        recv((count + 2 * kPad) * es, "test recv");
    auto* in = send.data() + kPad * es;
    auto* out = in_place ? in : recv.data() + kPad * es;
    for (size_t i = 0; i < count; ++i) check::put(in, i, t, value(r, i));
    g_comm->allreduce(in, out, count, t, rop, a);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += check::get(out, i, t) != expected(i, n, t, rop);
    return wrong;
  });
}

// Reduce-scatter: above 64 KiB the shared-memory one reduces its block
// straight from the peers' mappings of the inputs (2 barriers).
TEST(Collectives, RegisteredBuffersReduceScatterExact) {
  const int n = g_comm->size(), r = g_comm->rank();
  registered_cases(Op::reduce_scatter, [&](DType t, ReduceOp rop, size_t count, bool in_place,
                                           Algo a) {
    const size_t es = size_of(t), mine = block_count(count, n, r), off = block_offset(count, n, r);
    SharedBuffer send((count + 2 * kPad) * es, "test send");
    std::vector<unsigned char> out(mine * es + 1);
    auto* in = send.data() + kPad * es;
    auto* recv = in_place ? in + off * es : out.data();
    for (size_t i = 0; i < count; ++i) check::put(in, i, t, value(r, i));
    g_comm->reduce_scatter(in, recv, count, t, rop, a);
    size_t wrong = 0;
    for (size_t i = 0; i < mine; ++i)
      wrong += check::get(recv, i, t) != expected(off + i, n, t, rop);
    return wrong;
  });
}

// shared_region_of names the live buffer a range lies in, and nothing else.
TEST(SharedBuffers, RegionOfARangeInsideOnlyAndForgottenWhenFreed) {
  SharedBuffer a(10000, "a"), b(5000, "b");
  const auto in_a = shared_region_of(a.data() + 100, 9900);
  ASSERT_TRUE(in_a.has_value());
  EXPECT_EQ(in_a->offset, 100u);
  EXPECT_EQ(in_a->bytes, 10000u);
  const auto in_b = shared_region_of(b.data(), 5000);
  ASSERT_TRUE(in_b.has_value());
  EXPECT_NE(in_a->id, in_b->id);
  EXPECT_FALSE(shared_region_of(a.data() + 100, 9901).has_value());  // runs past the end
  std::vector<float> plain(16);
  EXPECT_FALSE(shared_region_of(plain.data(), 64).has_value());
  const uint64_t old_id = in_b->id;
  const unsigned char* where = b.data();
  b = SharedBuffer();
  const auto gone = shared_region_of(where, 1);
  EXPECT_TRUE(!gone.has_value() || gone->id != old_id);
  EXPECT_EQ(a.data()[9999], 0);  // zeroed
}

TEST(Collectives, MismatchedCollectiveTimesOutNamingOpStepAndRanks) {
  Communicator& c = *g_comm;
  if (c.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Rank 0 enters an all-reduce nobody else joins; it must fail, not hang.
  Communicator lonely(MPI_COMM_WORLD);
  float x = 1.0f;
  // Setting up shared memory is collective: do it together first.
  lonely.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::shm);
  lonely.set_timeout(1.0);
  if (c.rank() == 0) {
    for (Algo a : {Algo::ring, Algo::shm}) {
      try {
        lonely.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, a);
        ADD_FAILURE() << "expected a timeout for " << to_string(a);
      } catch (const CommTimeout& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("allreduce"), std::string::npos) << m;
        EXPECT_NE(m.find("step"), std::string::npos) << m;
        EXPECT_NE(m.find("did not arrive"), std::string::npos) << m;
      }
    }
  }
  c.barrier();
}

TEST(Async, StartedCollectivesRunWhileTheCallerComputesAndCommunicates) {
  Communicator& c = *g_comm;
  const int n = c.size(), r = c.rank();
  AsyncCommunicator async(MPI_COMM_WORLD);
  async.set_timeout(120);
  // Several in flight at once, of every algorithm, f32 and bf16, in place and not.
  const size_t count = 100003;
  std::vector<std::vector<unsigned char>> sends, recvs;
  std::vector<CommRequest> requests;
  std::vector<std::pair<Algo, DType>> runs;
  for (Algo a : algorithms_for(Op::allreduce)) {
    for (DType t : {DType::f32, DType::bf16}) {
      sends.push_back(filled(count, t, r));
      recvs.emplace_back(sends.back().size());
      runs.emplace_back(a, t);
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    requests.push_back(async.start_allreduce(sends[i].data(), recvs[i].data(), count,
                                             runs[i].second, ReduceOp::sum, runs[i].first));
  }
  // Meanwhile this thread runs a blocking collective of its own, then only
  // polls: the started collectives must complete on the progress thread
  // without a wait() to drive them (the deadline only guards against a hang).
  float x = static_cast<float>(r + 1);
  c.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::ring);
  EXPECT_EQ(x, static_cast<float>(n * (n + 1) / 2));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto all_done = [&] {
    return std::all_of(requests.begin(), requests.end(),
                       [](const CommRequest& q) { return q.test(); });
  };
  while (!all_done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(all_done()) << "started collectives did not complete without wait()";
  for (size_t i = 0; i < runs.size(); ++i) {
    requests[i].wait();
    EXPECT_TRUE(requests[i].test());
    size_t wrong = 0;
    for (size_t k = 0; k < count; ++k)
      wrong += get(recvs[i], k, runs[i].second) != expected(k, n, runs[i].second, ReduceOp::sum);
    EXPECT_EQ(wrong, 0u) << label(Op::allreduce, runs[i].first, runs[i].second, count, false,
                                  " (started)");
  }
}

TEST(Async, ReduceScatterAllgatherAndBroadcastStartAndWait) {
  const int n = g_comm->size(), r = g_comm->rank();
  AsyncCommunicator async(MPI_COMM_WORLD);
  const size_t count = static_cast<size_t>(n) * 1000 + 3;
  auto send = filled(count, DType::f32, r);
  std::vector<float> block(block_count(count, n, r) + 1), gathered(count);
  std::vector<float> bcast(777, r == n - 1 ? 5.0f : 0.0f);
  const size_t mine = block_count(count, n, r), off = block_offset(count, n, r);
  std::vector<float> own(mine);
  for (size_t i = 0; i < mine; ++i) own[i] = static_cast<float>(value(r, off + i));
  auto rs = async.start_reduce_scatter(send.data(), block.data(), count, DType::f32, ReduceOp::sum,
                                       Algo::shm);
  auto ag = async.start_allgather(own.data(), gathered.data(), count, DType::f32, Algo::ring);
  auto bc = async.start_broadcast(bcast.data(), bcast.size(), DType::f32, n - 1, Algo::tree);
  bc.wait();
  ag.wait();
  rs.wait();
  size_t wrong = 0;
  for (size_t i = 0; i < mine; ++i)
    wrong += block[i] != expected(off + i, n, DType::f32, ReduceOp::sum);
  for (int q = 0; q < n; ++q)
    for (size_t i = block_offset(count, n, q);
         i < block_offset(count, n, q) + block_count(count, n, q); ++i)
      wrong += gathered[i] != value(q, i);
  for (float v : bcast) wrong += v != 5.0f;
  EXPECT_EQ(wrong, 0u);
  CommRequest none;
  none.wait();  // a default request is done
  EXPECT_TRUE(none.test());
}

TEST(Async, AStuckCollectiveFailsAtWaitNotInAHang) {
  Communicator& c = *g_comm;
  if (c.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  AsyncCommunicator async(MPI_COMM_WORLD);
  float x = 1.0f;
  async.start_allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::ring).wait();
  async.set_timeout(1.0);
  if (c.rank() == 0) {
    auto lonely = async.start_allreduce(&x, &x, 1, DType::f32, ReduceOp::sum, Algo::ring);
    try {
      lonely.wait();
      ADD_FAILURE() << "expected a timeout";
    } catch (const CommTimeout& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    }
  }
  c.barrier();
}

}  // namespace
}  // namespace anvil::comm

int main(int argc, char** argv) {
  anvil::comm::MpiRuntime mpi(&argc, &argv, /*thread_multiple=*/true);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) ::testing::GTEST_FLAG(brief) = true;  // other ranks print failures only
  int rc = 0;
  {
    anvil::comm::Communicator comm(MPI_COMM_WORLD);
    comm.set_timeout(120);
    anvil::comm::g_comm = &comm;
    rc = RUN_ALL_TESTS();
    int any = 0;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = any;
  }
  return rc;
}
