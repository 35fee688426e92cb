#include "anvil/comm/mpi_transport.hpp"

#include <sched.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace anvil::comm {
namespace {

int rank_in(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int ranks_in(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  return size;
}

}  // namespace

int mpi_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw std::invalid_argument("mpi: count " + std::to_string(count) + " exceeds INT_MAX");
  }
  return static_cast<int>(count);
}

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

MpiTransport::MpiTransport(MPI_Comm comm) : PointToPoint(rank_in(comm), ranks_in(comm)) {
  MPI_Comm_dup(comm, &comm_);
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiTransport::wait_all(MPI_Request* reqs, int n, const int* peers, const char* what,
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

void MpiTransport::sendrecv(const void* send, size_t send_bytes, int dst, void* recv,
                            size_t recv_bytes, int src, const char* what, int step) {
  MPI_Request reqs[2];
  MPI_Irecv(recv, mpi_count(recv_bytes), MPI_BYTE, src, step, comm_, &reqs[0]);
  MPI_Isend(send, mpi_count(send_bytes), MPI_BYTE, dst, step, comm_, &reqs[1]);
  const int peers[2] = {src, dst};
  wait_all(reqs, 2, peers, what, step);
}

void MpiTransport::send(const void* buf, size_t bytes, int dst, const char* what, int step) {
  MPI_Request req;
  MPI_Isend(buf, mpi_count(bytes), MPI_BYTE, dst, step, comm_, &req);
  wait_all(&req, 1, &dst, what, step);
}

void MpiTransport::recv(void* buf, size_t bytes, int src, const char* what, int step) {
  MPI_Request req;
  MPI_Irecv(buf, mpi_count(bytes), MPI_BYTE, src, step, comm_, &req);
  wait_all(&req, 1, &src, what, step);
}

void MpiTransport::barrier(const char* what) {
  MPI_Request req;
  MPI_Ibarrier(comm_, &req);
  const int any = -1;
  wait_all(&req, 1, &any, what, 0);
}

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
