// Non-blocking collectives: start now, wait later, so the trainer can overlap
// gradient reduction with backward compute. An AsyncCommunicator owns a
// progress thread and a Communicator of its own (a duplicate of the given MPI
// communicator, with its own shared-memory segment); started collectives run
// on that thread one at a time in the order they were started. As with MPI's
// non-blocking collectives, every rank must start the same collectives in the
// same order. Buffers belong to the collective until wait() returns.
// Needs MPI_THREAD_MULTIPLE (MpiRuntime(argc, argv, /*thread_multiple=*/true)),
// because the caller's thread keeps using MPI meanwhile.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "anvil/comm/communicator.hpp"

namespace anvil::comm {

class CommRequest {
 public:
  CommRequest() = default;
  // Blocks until the collective has run; rethrows its error (CommTimeout,
  // InputError, ...). A default-constructed request is already done.
  void wait();
  // True once the collective has run (its error, if any, comes from wait()).
  bool test() const;

 private:
  friend class AsyncCommunicator;
  struct State {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
};

class AsyncCommunicator {
 public:
  // Collective over `comm` (duplicates it); ranks_per_node as in Communicator.
  explicit AsyncCommunicator(MPI_Comm comm = MPI_COMM_WORLD, int ranks_per_node = 0);
  // Runs what was started, then stops the thread.
  ~AsyncCommunicator();
  AsyncCommunicator(const AsyncCommunicator&) = delete;
  AsyncCommunicator& operator=(const AsyncCommunicator&) = delete;

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  // Applies to collectives started afterwards.
  void set_timeout(double seconds);

  CommRequest start_allreduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                              Algo algo);
  CommRequest start_reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                                   Algo algo);
  CommRequest start_allgather(const void* send, void* recv, size_t count, DType t, Algo algo);
  CommRequest start_broadcast(void* buf, size_t count, DType t, int root, Algo algo);
  // Any collective of the progress thread's Communicator.
  CommRequest start(std::function<void(Communicator&)> collective);

 private:
  void run();

  std::unique_ptr<Communicator> comm_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::deque<std::pair<std::function<void(Communicator&)>, std::shared_ptr<CommRequest::State>>>
      queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace anvil::comm
