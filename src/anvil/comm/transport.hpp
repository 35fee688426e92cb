// The interface anvil's collective algorithms are written against: a group
// of ranks that meet at barriers and give up at a deadline, naming who did
// not arrive; point-to-point transports also exchange messages. Two
// implement it: MPI point-to-point (mpi_transport.hpp) and one POSIX
// shared-memory segment per node (shm_transport.hpp).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace anvil::comm {

// A wait that outlived its deadline (Transport::fail_timeout says who is missing).
class CommTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Transport {
 public:
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Seconds one wait may take before the call throws CommTimeout.
  virtual double timeout() const = 0;
  // No rank leaves before every rank has arrived; `what` names the op in a timeout.
  virtual void barrier(const char* what) = 0;
  // Throws CommTimeout: "rank R: WHAT timed out after T s at step S; rank(s)
  // M did not arrive" (negative entries of `missing` are unknown ranks).
  [[noreturn]] void fail_timeout(const std::string& what, int step,
                                 const std::vector<int>& missing) const;

 protected:
  Transport(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_, size_;
};

// Messages between two ranks, every wait bounded by the deadline. `step`
// tags the message, so peers match on it, and names the step in a timeout.
class PointToPoint : public Transport {
 public:
  virtual void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                        int src, const char* what, int step) = 0;
  virtual void send(const void* buf, size_t bytes, int dst, const char* what, int step) = 0;
  virtual void recv(void* buf, size_t bytes, int src, const char* what, int step) = 0;

 protected:
  using Transport::Transport;
};

}  // namespace anvil::comm
