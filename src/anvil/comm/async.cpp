#include "anvil/comm/async.hpp"

#include <omp.h>

#include "anvil/base/error.hpp"

namespace anvil::comm {

void CommRequest::wait() {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->done_cv.wait(lock, [&] { return state_->done; });
  if (state_->error) {
    auto error = state_->error;
    state_->error = nullptr;  // reported once
    std::rethrow_exception(error);
  }
}

bool CommRequest::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

AsyncCommunicator::AsyncCommunicator(MPI_Comm comm, int ranks_per_node) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    throw SystemError(
        "non-blocking collectives need MPI_THREAD_MULTIPLE; start MPI with "
        "MpiRuntime(argc, argv, /*thread_multiple=*/true)");
  }
  comm_ = std::make_unique<Communicator>(comm, ranks_per_node);
  thread_ = std::thread([this] { run(); });
}

AsyncCommunicator::~AsyncCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  thread_.join();
}

void AsyncCommunicator::set_timeout(double seconds) {
  start([seconds](Communicator& c) { c.set_timeout(seconds); });
}

CommRequest AsyncCommunicator::start(std::function<void(Communicator&)> collective) {
  CommRequest request;
  request.state_ = std::make_shared<CommRequest::State>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(collective), request.state_);
  }
  work_cv_.notify_one();
  return request;
}

CommRequest AsyncCommunicator::start_allreduce(const void* send, void* recv, size_t count, DType t,
                                               ReduceOp op, Algo algo) {
  return start([=](Communicator& c) { c.allreduce(send, recv, count, t, op, algo); });
}

CommRequest AsyncCommunicator::start_reduce_scatter(const void* send, void* recv, size_t count,
                                                    DType t, ReduceOp op, Algo algo) {
  return start([=](Communicator& c) { c.reduce_scatter(send, recv, count, t, op, algo); });
}

CommRequest AsyncCommunicator::start_allgather(const void* send, void* recv, size_t count, DType t,
                                               Algo algo) {
  return start([=](Communicator& c) { c.allgather(send, recv, count, t, algo); });
}

CommRequest AsyncCommunicator::start_broadcast(void* buf, size_t count, DType t, int root,
                                               Algo algo) {
  return start([=](Communicator& c) { c.broadcast(buf, count, t, root, algo); });
}

void AsyncCommunicator::run() {
  // Reductions on this thread use one core: the others are computing while
  // the collective runs (that is the point of starting it early).
  omp_set_num_threads(1);
  for (;;) {
    std::pair<std::function<void(Communicator&)>, std::shared_ptr<CommRequest::State>> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything started has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      task.first(*comm_);
    } catch (...) {
      error = std::current_exception();
    }
    {
      // Moved, not copied: the waiting thread then holds the only reference
      // to the exception, handed over under the mutex (a copy released here
      // later would free it on this thread, unordered with the waiter's
      // reads as far as ThreadSanitizer can see).
      std::lock_guard<std::mutex> lock(task.second->mutex);
      task.second->done = true;
      task.second->error = std::move(error);
    }
    task.second->done_cv.notify_all();
  }
}

}  // namespace anvil::comm
