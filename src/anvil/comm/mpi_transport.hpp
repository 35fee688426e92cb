// MPI as a point-to-point transport: a duplicate of the caller's MPI
// communicator (anvil's traffic never mixes with the caller's), non-blocking
// sends and receives polled against the deadline, and a watchdog for the
// blocking library calls (collectives, setup steps) that no deadline can
// interrupt. Also MpiRuntime, which owns MPI for the process.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>

#include "anvil/base/clock.hpp"
#include "anvil/comm/transport.hpp"

namespace anvil::comm {

// MPI counts are ints: throws std::invalid_argument above INT_MAX.
int mpi_count(size_t count);

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

class MpiTransport final : public PointToPoint {
 public:
  // Duplicates `comm`.
  explicit MpiTransport(MPI_Comm comm);
  ~MpiTransport() override;

  MPI_Comm mpi_comm() const { return comm_; }
  double timeout() const override { return timeout_s_; }
  void set_timeout(double seconds) {
    timeout_s_ = seconds;
    if (watchdog_) watchdog_->set_timeout(seconds);
  }

  void barrier(const char* what) override;
  void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                int src, const char* what, int step) override;
  void send(const void* buf, size_t bytes, int dst, const char* what, int step) override;
  void recv(void* buf, size_t bytes, int src, const char* what, int step) override;

  // Runs one blocking MPI call under the watchdog: past the deadline the
  // process ends with a line naming `what` (MPI cannot say who is missing).
  template <typename Body>
  void blocking(const char* what, Body call) {
    if (!watchdog_) watchdog_ = std::make_unique<MpiWatchdog>(rank(), timeout_s_);
    watchdog_->arm(what);
    try {
      call();
    } catch (...) {
      watchdog_->disarm();
      throw;
    }
    watchdog_->disarm();
  }

 private:
  void wait_all(MPI_Request* reqs, int n, const int* peers, const char* what, int step);

  std::unique_ptr<MpiWatchdog> watchdog_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  double timeout_s_ = 60.0;
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
