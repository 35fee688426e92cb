#include "anvil/comm/communicator.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/comm/algorithms.hpp"
#include "anvil/comm/reduce.hpp"
#include "anvil/comm/shm.hpp"

namespace anvil::comm {
namespace {

// ---- The MPI library's collectives (the baseline) -------------------------

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
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
      return MPI_UINT16_T;  // with the bf16 ops below
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  if (t == DType::bf16) {
    // MPI has no bf16: user ops over 16-bit words, created once.
    static MPI_Op ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
    if (ops[0] == MPI_OP_NULL) {
      MPI_Op_create(&bf16_op<Add>, 1, &ops[0]);
      MPI_Op_create(&bf16_op<Max>, 1, &ops[1]);
      MPI_Op_create(&bf16_op<Min>, 1, &ops[2]);
    }
    return op == ReduceOp::max ? ops[1] : op == ReduceOp::min ? ops[2] : ops[0];
  }
  return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM;
}

int mpi_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw std::invalid_argument("mpi: count " + std::to_string(count) + " exceeds INT_MAX");
  }
  return static_cast<int>(count);
}

void check_op(DType t, ReduceOp op) {
  if (op == ReduceOp::avg && !is_floating(t)) {
    throw InputError("avg needs a floating dtype, got " + to_string(t));
  }
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

void unsupported(Op op, Algo a) {
  throw InputError("--algo: " + to_string(a) + " does not implement " + to_string(op));
}

}  // namespace

// ---- names -----------------------------------------------------------------

std::string to_string(Algo a) {
  switch (a) {
    case Algo::mpi:
      return "mpi";
    case Algo::ring:
      return "ring";
    case Algo::rhd:
      return "rhd";
    case Algo::tree:
      return "tree";
    case Algo::pairwise:
      return "pairwise";
    case Algo::shm:
      return "shm";
    case Algo::hier:
      return "hier";
    case Algo::automatic:
      return "auto";
  }
  return "?";
}

std::string to_string(Op op) {
  switch (op) {
    case Op::allreduce:
      return "allreduce";
    case Op::reduce_scatter:
      return "reduce_scatter";
    case Op::allgather:
      return "allgather";
    case Op::broadcast:
      return "broadcast";
    case Op::reduce:
      return "reduce";
    case Op::alltoall:
      return "alltoall";
  }
  return "?";
}

Algo parse_algo(const std::string& name, const std::string& flag) {
  for (Algo a : {Algo::mpi, Algo::ring, Algo::rhd, Algo::tree, Algo::pairwise, Algo::shm,
                 Algo::hier, Algo::automatic}) {
    if (to_string(a) == name) return a;
  }
  throw InputError(flag + ": expected mpi, ring, rhd, tree, pairwise, shm, hier or auto, got '" +
                   name + "'");
}

Op parse_op(const std::string& name, const std::string& flag) {
  for (Op op : {Op::allreduce, Op::reduce_scatter, Op::allgather, Op::broadcast, Op::reduce,
                Op::alltoall}) {
    if (to_string(op) == name) return op;
  }
  throw InputError(flag +
                   ": expected allreduce, reduce_scatter, allgather, broadcast, reduce or "
                   "alltoall, got '" +
                   name + "'");
}

std::vector<Algo> algorithms_for(Op op) {
  switch (op) {
    case Op::allreduce:
      return {Algo::mpi, Algo::ring, Algo::rhd, Algo::shm, Algo::hier, Algo::automatic};
    case Op::reduce_scatter:
      return {Algo::mpi, Algo::ring, Algo::shm, Algo::automatic};
    case Op::allgather:
      return {Algo::mpi, Algo::ring, Algo::shm, Algo::automatic};
    case Op::broadcast:
      return {Algo::mpi, Algo::tree, Algo::shm, Algo::automatic};
    case Op::reduce:
      return {Algo::mpi, Algo::tree, Algo::shm, Algo::automatic};
    case Op::alltoall:
      return {Algo::mpi, Algo::pairwise, Algo::automatic};
  }
  return {};
}

// ---- auto ----------------------------------------------------------------------

Algo TuningTable::pick(Op op, int ranks, size_t bytes, bool single_node) const {
  for (const auto& r : rows) {
    if (r.op == op && r.ranks == ranks && static_cast<int64_t>(bytes) <= r.max_bytes) {
      const bool needs_one_node = r.algo == Algo::shm;
      if (!needs_one_node || single_node) return r.algo;
    }
  }
  if (single_node) return op == Op::alltoall ? Algo::mpi : Algo::shm;
  return op == Op::allreduce ? Algo::hier : Algo::mpi;
}

TuningTable TuningTable::load(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not a tuning table (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", "") != "anvil-comm-tuning" || !j.contains("rows") ||
      !j["rows"].is_array()) {
    throw InputError(path + ": expected {\"format\": \"anvil-comm-tuning\", \"rows\": [...]}");
  }
  TuningTable t;
  for (size_t i = 0; i < j["rows"].size(); ++i) {
    const auto& r = j["rows"][i];
    const std::string where = path + ": rows[" + std::to_string(i) + "]";
    try {
      const Algo a = parse_algo(r.at("algo").get<std::string>(), where + ".algo");
      if (a == Algo::automatic) throw InputError(where + ".algo: auto cannot choose itself");
      t.rows.push_back({parse_op(r.at("op").get<std::string>(), where + ".op"),
                        r.at("ranks").get<int>(), r.at("max_bytes").get<int64_t>(), a});
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": expected op, ranks, max_bytes, algo (" + e.what() + ")");
    }
  }
  std::stable_sort(t.rows.begin(), t.rows.end(), [](const TuningRow& a, const TuningRow& b) {
    return a.max_bytes < b.max_bytes;
  });
  return t;
}

void TuningTable::save(const std::string& path) const {
  nlohmann::json j = {
      {"format", "anvil-comm-tuning"}, {"version", 1}, {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    j["rows"].push_back({{"op", to_string(r.op)},
                         {"ranks", r.ranks},
                         {"max_bytes", r.max_bytes},
                         {"algo", to_string(r.algo)}});
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

Algo Communicator::resolve(Op op, Algo algo, size_t bytes) const {
  return algo == Algo::automatic ? tuning_.pick(op, size_, bytes, single_node_) : algo;
}

// ---- Communicator ------------------------------------------------------------

MpiWatchdog::MpiWatchdog(int rank, double timeout_s)
    : rank_(rank), timeout_s_(timeout_s), thread_([this] { run(); }) {}

MpiWatchdog::~MpiWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void MpiWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; })) {
    const double deadline = deadline_.load();
    if (deadline > 0 && now_seconds() > deadline) {
      std::fprintf(stderr,
                   "anvil: error: rank %d: %s did not finish within %g s (MPI's own collective "
                   "cannot say which ranks did not arrive); ending the job\n",
                   rank_, what_.load(), timeout_s_);
      std::fflush(stderr);
      std::_Exit(3);  // mpirun then ends the other ranks
    }
  }
}

Communicator::Communicator(MPI_Comm comm, int ranks_per_node) : ranks_per_node_(ranks_per_node) {
  MPI_Comm_dup(comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm node;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int local = node_size == size_, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm_);
  single_node_ = all != 0;
  if (const char* path = std::getenv("ANVIL_COMM_TUNING")) tuning_ = TuningTable::load(path);
}

Communicator::~Communicator() {
  shm_.reset();
  node_.reset();
  cross_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

ShmSegment& Communicator::shm() {
  if (!single_node_) {
    throw InputError("--algo shm: the ranks of this communicator span more than one node");
  }
  // Setting up the segment is collective (blocking MPI calls): under the watchdog.
  if (!shm_) blocking_mpi("shm segment setup", [&] { shm_ = std::make_unique<ShmSegment>(*this); });
  return *shm_;
}

void Communicator::fail_timeout(const std::string& what, int step,
                                const std::vector<int>& missing) const {
  std::string ranks;
  for (int m : missing) {
    if (m >= 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(m);
  }
  throw CommTimeout("rank " + std::to_string(rank_) + ": " + what + " timed out after " +
                    std::to_string(static_cast<int>(timeout_s_)) + " s at step " +
                    std::to_string(step) + "; " +
                    (ranks.empty() ? std::string("some rank (a barrier does not say which)")
                                   : "rank(s) " + ranks) +
                    " did not arrive");
}

void Communicator::wait_all(MPI_Request* reqs, int n, const int* peers, const char* what,
                            int step) {
  const double deadline = now_seconds() + timeout_s_;
  unsigned polls = 0;
  for (;;) {
    int done = 0;
    MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    // Poll, then yield (an oversubscribed peer may need this core), then
    // sleep between polls: a progress thread waiting on the network must
    // not take a core from the compute threads beside it.
    ++polls;
    if (polls > 4096) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else if (polls > 256) {
      ::sched_yield();
    }
    if (polls % 256 == 0 && now_seconds() > deadline) {
      std::vector<int> missing;
      for (int i = 0; i < n; ++i) {
        int flag = 0;
        if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) missing.push_back(peers[i]);
      }
      fail_timeout(what, step, missing);
    }
  }
}

void Communicator::sendrecv(const void* send, size_t send_bytes, int dst, void* recv,
                            size_t recv_bytes, int src, const char* what, int step) {
  MPI_Request reqs[2];
  MPI_Irecv(recv, mpi_count(recv_bytes), MPI_BYTE, src, step, comm_, &reqs[0]);
  MPI_Isend(send, mpi_count(send_bytes), MPI_BYTE, dst, step, comm_, &reqs[1]);
  const int peers[2] = {src, dst};
  wait_all(reqs, 2, peers, what, step);
}

void Communicator::send(const void* buf, size_t bytes, int dst, const char* what, int step) {
  MPI_Request req;
  MPI_Isend(buf, mpi_count(bytes), MPI_BYTE, dst, step, comm_, &req);
  wait_all(&req, 1, &dst, what, step);
}

void Communicator::recv(void* buf, size_t bytes, int src, const char* what, int step) {
  MPI_Request req;
  MPI_Irecv(buf, mpi_count(bytes), MPI_BYTE, src, step, comm_, &req);
  wait_all(&req, 1, &src, what, step);
}

void Communicator::barrier() {
  MPI_Request req;
  MPI_Ibarrier(comm_, &req);
  const int any = -1;
  wait_all(&req, 1, &any, "barrier", 0);
}

void Communicator::allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                             Algo algo) {
  algo = resolve(Op::allreduce, algo, count * size_of(t));
  check_op(t, op);
  const size_t bytes = count * size_of(t);
  if (algo == Algo::shm) return shm().allreduce(send, recv, count, t, op);
  if (algo == Algo::hier) {
    if (send != recv && bytes) std::memcpy(recv, send, bytes);
    return hier_allreduce(recv, count, t, op);
  }
  if (algo == Algo::mpi) {
    blocking_mpi("allreduce(mpi)", [&] {
      MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, mpi_count(count), mpi_type(t),
                    mpi_op(t, op), comm_);
    });
  } else {
    if (send != recv && bytes) std::memcpy(recv, send, bytes);
    if (algo == Algo::ring) {
      algo::ring_allreduce(*this, recv, count, t, op);
    } else if (algo == Algo::rhd) {
      algo::rhd_allreduce(*this, recv, count, t, op);
    } else {
      unsupported(Op::allreduce, algo);
    }
  }
  if (op == ReduceOp::avg) divide_by(recv, count, t, size_);
}

void Communicator::make_hier_communicators() {
  int color = 0;
  if (ranks_per_node_ > 0) {
    if (size_ % ranks_per_node_ != 0) {
      throw InputError("--ranks-per-node: " + std::to_string(ranks_per_node_) +
                       " does not divide the " + std::to_string(size_) + " ranks");
    }
    color = rank_ / ranks_per_node_;
  } else {
    // Real nodes: number them by their lowest world rank.
    MPI_Comm shared;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared);
    MPI_Allreduce(&rank_, &color, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
  }
  MPI_Comm node, cross;
  MPI_Comm_split(comm_, color, rank_, &node);
  int local = 0, local_size = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  int min_size = 0, max_size = 0;
  MPI_Allreduce(&local_size, &min_size, 1, MPI_INT, MPI_MIN, comm_);
  MPI_Allreduce(&local_size, &max_size, 1, MPI_INT, MPI_MAX, comm_);
  if (min_size != max_size) {
    MPI_Comm_free(&node);
    throw InputError("--algo hier: nodes hold different numbers of ranks (" +
                     std::to_string(min_size) + " to " + std::to_string(max_size) + ")");
  }
  MPI_Comm_split(comm_, local, rank_, &cross);
  node_ = std::make_unique<Communicator>(node);
  cross_ = std::make_unique<Communicator>(cross);
  MPI_Comm_free(&node);
  MPI_Comm_free(&cross);
}

void Communicator::hier_allreduce(void* data, size_t count, DType t, ReduceOp op) {
  if (!node_) blocking_mpi("hier setup", [&] { make_hier_communicators(); });
  node_->set_timeout(timeout_s_);
  cross_->set_timeout(timeout_s_);
  // Inside the node: each local rank ends with its block reduced over the node.
  const int local = node_->rank(), local_size = node_->size();
  const size_t es = size_of(t);
  const ReduceOp inner = op == ReduceOp::avg ? ReduceOp::sum : op;
  unsigned char* block =
      static_cast<unsigned char*>(data) + block_offset(count, local_size, local) * es;
  const size_t mine = block_count(count, local_size, local);
  std::vector<unsigned char> staged(mine * es + 1);
  node_->reduce_scatter(data, staged.data(), count, t, inner, Algo::shm);
  // Across nodes: the ranks holding the same block reduce it among themselves.
  cross_->allreduce(staged.data(), staged.data(), mine, t, inner, Algo::ring);
  if (op == ReduceOp::avg) divide_by(staged.data(), mine, t, size_);
  if (mine) std::memcpy(block, staged.data(), mine * es);
  node_->allgather(block, data, count, t, Algo::shm);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                                  Algo algo) {
  algo = resolve(Op::reduce_scatter, algo, count * size_of(t));
  check_op(t, op);
  const size_t es = size_of(t);
  const size_t mine = block_count(count, size_, rank_);
  const size_t my_off = block_offset(count, size_, rank_);
  if (algo == Algo::shm) return shm().reduce_scatter(send, recv, count, t, op);
  if (algo == Algo::mpi) {
    std::vector<int> counts(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r)
      counts[static_cast<size_t>(r)] = mpi_count(block_count(count, size_, r));
    // In place (recv inside send) is not MPI's in-place layout: stage a copy.
    std::vector<unsigned char> staged;
    const void* in = send;
    if (overlaps(send, count * es, recv, mine * es)) {
      staged.assign(static_cast<const unsigned char*>(send),
                    static_cast<const unsigned char*>(send) + count * es);
      in = staged.data();
    }
    blocking_mpi("reduce_scatter(mpi)", [&] {
      MPI_Reduce_scatter(in, recv, counts.data(), mpi_type(t), mpi_op(t, op), comm_);
    });
  } else if (algo == Algo::ring) {
    std::vector<unsigned char> work(static_cast<const unsigned char*>(send),
                                    static_cast<const unsigned char*>(send) + count * es);
    algo::ring_reduce_scatter_inplace(*this, work.data(), count, t, op, "reduce_scatter(ring)");
    if (mine) std::memcpy(recv, work.data() + my_off * es, mine * es);
  } else {
    unsupported(Op::reduce_scatter, algo);
  }
  if (op == ReduceOp::avg) divide_by(recv, mine, t, size_);
}

void Communicator::allgather(const void* send, void* recv, size_t count, DType t, Algo algo) {
  algo = resolve(Op::allgather, algo, count * size_of(t));
  const size_t es = size_of(t);
  const size_t mine = block_count(count, size_, rank_);
  auto* my_block = static_cast<unsigned char*>(recv) + block_offset(count, size_, rank_) * es;
  const bool in_place = send == my_block;
  if (algo == Algo::shm) return shm().allgather(send, recv, count, t);
  if (algo == Algo::mpi) {
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      counts[static_cast<size_t>(r)] = mpi_count(block_count(count, size_, r));
      displs[static_cast<size_t>(r)] = mpi_count(block_offset(count, size_, r));
    }
    blocking_mpi("allgather(mpi)", [&] {
      MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, counts[static_cast<size_t>(rank_)],
                     mpi_type(t), recv, counts.data(), displs.data(), mpi_type(t), comm_);
    });
  } else if (algo == Algo::ring) {
    if (!in_place && mine) std::memcpy(my_block, send, mine * es);
    algo::ring_allgather_inplace(*this, recv, count, t, "allgather(ring)");
  } else {
    unsupported(Op::allgather, algo);
  }
}

void Communicator::broadcast(void* buf, size_t count, DType t, int root, Algo algo) {
  algo = resolve(Op::broadcast, algo, count * size_of(t));
  if (root < 0 || root >= size_) {
    throw InputError("--root: expected 0.." + std::to_string(size_ - 1) + ", got " +
                     std::to_string(root));
  }
  if (algo == Algo::shm) return shm().broadcast(buf, count, t, root);
  if (algo == Algo::mpi) {
    blocking_mpi("broadcast(mpi)",
                 [&] { MPI_Bcast(buf, mpi_count(count), mpi_type(t), root, comm_); });
  } else if (algo == Algo::tree) {
    algo::tree_broadcast(*this, buf, count, t, root);
  } else {
    unsupported(Op::broadcast, algo);
  }
}

void Communicator::reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                          int root, Algo algo) {
  algo = resolve(Op::reduce, algo, count * size_of(t));
  check_op(t, op);
  if (root < 0 || root >= size_) {
    throw InputError("--root: expected 0.." + std::to_string(size_ - 1) + ", got " +
                     std::to_string(root));
  }
  const size_t bytes = count * size_of(t);
  if (algo == Algo::shm) return shm().reduce(send, recv, count, t, op, root);
  if (algo == Algo::mpi) {
    const bool in_place = rank_ == root && send == recv;
    blocking_mpi("reduce(mpi)", [&] {
      MPI_Reduce(in_place ? MPI_IN_PLACE : send, recv, mpi_count(count), mpi_type(t), mpi_op(t, op),
                 root, comm_);
    });
  } else if (algo == Algo::tree) {
    std::vector<unsigned char> acc(static_cast<const unsigned char*>(send),
                                   static_cast<const unsigned char*>(send) + bytes);
    algo::tree_reduce(*this, acc.data(), count, t, op, root);
    if (rank_ == root && bytes) std::memcpy(recv, acc.data(), bytes);
  } else {
    unsupported(Op::reduce, algo);
  }
  if (op == ReduceOp::avg && rank_ == root) divide_by(recv, count, t, size_);
}

void Communicator::alltoall(const void* send, void* recv, size_t count, DType t, Algo algo) {
  algo = resolve(Op::alltoall, algo, count * size_of(t) * static_cast<size_t>(size_));
  std::vector<size_t> counts(static_cast<size_t>(size_), count),
      offsets(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) offsets[static_cast<size_t>(r)] = static_cast<size_t>(r) * count;
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
  for (int r = 0; r < size_; ++r) {
    send_extent = std::max(send_extent, send_offsets[r] + send_counts[r]);
    recv_extent = std::max(recv_extent, recv_offsets[r] + recv_counts[r]);
  }
  // In place: stage the input, then every algorithm sees separate buffers.
  std::vector<unsigned char> staged;
  if (overlaps(send, send_extent * es, recv, recv_extent * es)) {
    staged.assign(static_cast<const unsigned char*>(send),
                  static_cast<const unsigned char*>(send) + send_extent * es);
    send = staged.data();
  }
  if (algo == Algo::mpi) {
    std::vector<int> sc(static_cast<size_t>(size_)), so(sc), rc(sc), ro(sc);
    for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
      sc[r] = mpi_count(send_counts[r]);
      so[r] = mpi_count(send_offsets[r]);
      rc[r] = mpi_count(recv_counts[r]);
      ro[r] = mpi_count(recv_offsets[r]);
    }
    blocking_mpi("alltoall(mpi)", [&] {
      MPI_Alltoallv(send, sc.data(), so.data(), mpi_type(t), recv, rc.data(), ro.data(),
                    mpi_type(t), comm_);
    });
  } else if (algo == Algo::pairwise) {
    algo::pairwise_alltoallv(*this, send, send_counts, send_offsets, recv, recv_counts,
                             recv_offsets, t);
  } else {
    unsupported(Op::alltoall, algo);
  }
}

// ---- MpiRuntime --------------------------------------------------------------

MpiRuntime::MpiRuntime(int* argc, char*** argv, bool thread_multiple) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(argc, argv, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                    &provided);
    owns_ = true;
  }
  // An MPI error is a bug or a dead peer: stop the job with MPI's message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

}  // namespace anvil::comm
