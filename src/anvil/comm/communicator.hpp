// anvil's collectives. One Communicator per MPI communicator; each call
// names its algorithm, and every algorithm is separate from the transport
// it runs on (MPI point-to-point, or POSIX shared memory inside a node):
//
//   mpi       the MPI library's own collective (the baseline)
//   ring      ring reduce-scatter / all-gather (all-reduce = both): 2(n-1)
//             steps, each moving count/n elements per rank — bandwidth-optimal
//   rhd       Rabenseifner: recursive halving reduce-scatter + recursive
//             doubling all-gather, 2 log2(p) steps; non-powers of two fold
//             the first 2r ranks in pairs first (r = n - 2^floor(log2 n))
//   tree      binomial tree broadcast / reduce: ceil(log2 n) steps
//   pairwise  all-to-all(v): n-1 exchange steps with peers rank +/- s
//   shm       shared memory inside a node: chunked and pipelined, every rank
//             reducing its share of each chunk in parallel (see shm.hpp)
//   hier      two levels (all-reduce): shm reduce-scatter inside each node,
//             ring all-reduce of each block across nodes among the ranks with
//             the same local index, shm all-gather inside each node. Nodes are
//             found with MPI_COMM_TYPE_SHARED, or simulated with ranks_per_node
//   auto      per (op, ranks, size) from a tuning table that `anvil bench comm
//             --tuning-out` writes (ANVIL_COMM_TUNING names it); without one:
//             shm on one node (mpi for all-to-all), hier/mpi across nodes
//
// Semantics follow NCCL: reduce-scatter and all-gather split `count`
// elements into blocks with block_count/block_offset (types.hpp); in-place
// means recv == send (all-reduce, broadcast, reduce, all-to-all),
// recv == send + block_offset(rank) (reduce-scatter) or
// send == recv + block_offset(rank) (all-gather).
//
// No silent hangs: every wait has a deadline (set_timeout); past it the call
// throws CommTimeout naming the op, the algorithm, the step and the ranks
// that did not arrive. The `mpi` algorithm calls the library's blocking
// collectives (the baseline must stay the library's own code path), which
// cannot be interrupted: a watchdog thread ends the process past the
// deadline with a message naming the op (MPI does not say who is missing).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "anvil/base/clock.hpp"
#include "anvil/comm/types.hpp"

namespace anvil::comm {

enum class Algo { mpi, ring, rhd, tree, pairwise, shm, hier, automatic };
enum class Op { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall };

std::string to_string(Algo a);
std::string to_string(Op op);
Algo parse_algo(const std::string& name, const std::string& flag);
Op parse_op(const std::string& name, const std::string& flag);
// The algorithms implemented for an op.
std::vector<Algo> algorithms_for(Op op);

// What `auto` runs: for an op and rank count, the first row whose max_bytes
// covers the message. The JSON format is in docs/comm.md.
struct TuningRow {
  Op op;
  int ranks = 1;
  int64_t max_bytes = 0;
  Algo algo = Algo::mpi;
};

class TuningTable {
 public:
  std::vector<TuningRow> rows;
  // The row's algorithm, or the built-in rule when no row covers the call.
  Algo pick(Op op, int ranks, size_t bytes, bool single_node) const;
  static TuningTable load(const std::string& path);  // throws InputError naming the path
  void save(const std::string& path) const;          // atomic
};

class CommTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShmSegment;

// Ends the process when an armed blocking MPI call outlives its deadline.
class MpiWatchdog {
 public:
  MpiWatchdog(int rank, double timeout_s);
  ~MpiWatchdog();
  void arm(const char* what) {
    what_.store(what);
    deadline_.store(now_seconds() + timeout_s_);
  }
  void disarm() { deadline_.store(0.0); }
  void set_timeout(double s) { timeout_s_ = s; }

 private:
  void run();
  int rank_;
  double timeout_s_;
  std::atomic<const char*> what_{""};
  std::atomic<double> deadline_{0.0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class Communicator {
 public:
  // Duplicates `comm` (anvil's traffic never mixes with the caller's).
  // ranks_per_node > 0 simulates nodes of that many consecutive ranks for
  // `hier` (one machine standing in for several); 0 finds the real nodes.
  explicit Communicator(MPI_Comm comm = MPI_COMM_WORLD, int ranks_per_node = 0);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }
  void set_timeout(double seconds) {
    timeout_s_ = seconds;
    if (watchdog_) watchdog_->set_timeout(seconds);
  }
  double timeout() const { return timeout_s_; }
  // True when every rank of this communicator shares one node (shm works).
  bool single_node() const { return single_node_; }

  void allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, Algo algo);
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op, Algo algo);
  void allgather(const void* send, void* recv, size_t count, DType t, Algo algo);
  void broadcast(void* buf, size_t count, DType t, int root, Algo algo);
  void reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, int root,
              Algo algo);
  // `count` elements to and from every peer.
  void alltoall(const void* send, void* recv, size_t count, DType t, Algo algo);
  // Per-peer counts and offsets, in elements.
  void alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                 void* recv, const size_t* recv_counts, const size_t* recv_offsets, DType t,
                 Algo algo);
  void barrier();

  // Point-to-point with the deadline, for algorithms (algorithms/*.cpp).
  void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                int src, const char* what, int step);
  void send(const void* buf, size_t bytes, int dst, const char* what, int step);
  void recv(void* buf, size_t bytes, int src, const char* what, int step);
  [[noreturn]] void fail_timeout(const std::string& what, int step,
                                 const std::vector<int>& missing) const;
  ShmSegment& shm();
  void set_tuning(TuningTable table) { tuning_ = std::move(table); }
  // The algorithm a call with `algo` runs (resolves auto).
  Algo resolve(Op op, Algo algo, size_t bytes) const;

 private:
  void wait_all(MPI_Request* reqs, int n, const int* peers, const char* what, int step);
  void hier_allreduce(void* data, size_t count, DType t, ReduceOp op);
  void make_hier_communicators();  // node_ and cross_ (collective)
  // Arms the watchdog around one blocking library collective.
  template <typename Call>
  void blocking_mpi(const char* what, Call call) {
    if (!watchdog_) watchdog_ = std::make_unique<MpiWatchdog>(rank_, timeout_s_);
    watchdog_->arm(what);
    try {
      call();
    } catch (...) {
      watchdog_->disarm();
      throw;
    }
    watchdog_->disarm();
  }
  std::unique_ptr<MpiWatchdog> watchdog_;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool single_node_ = true;
  double timeout_s_ = 60.0;
  std::unique_ptr<ShmSegment> shm_;
  int ranks_per_node_ = 0;
  TuningTable tuning_;
  std::unique_ptr<Communicator> node_, cross_;  // for hier, made on first use
};

// Owns MPI for the process: MPI_Init on construction (if needed), MPI_Finalize
// on destruction. Created once, in main. thread_multiple asks for
// MPI_THREAD_MULTIPLE (needed by AsyncCommunicator); otherwise FUNNELED.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv, bool thread_multiple = false);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  bool owns_ = false;
};

}  // namespace anvil::comm
