// Algorithms are written against the transport interface, not MPI: the ring
// all-reduce runs over a point-to-point transport of threads in one process
// and gives the exact reduction in its documented 2(n-1) exchanges per rank.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "anvil/comm/check.hpp"
#include "anvil/comm/families.hpp"

namespace anvil::comm {
namespace {

// Messages between threads, queued per (source, destination, tag).
class Mailboxes {
 public:
  void post(int src, int dst, int tag, const void* data, size_t bytes) {
    const auto* d = static_cast<const unsigned char*>(data);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queues_[{src, dst, tag}].emplace_back(d, d + bytes);
    }
    arrived_.notify_all();
  }
  void take(int src, int dst, int tag, void* data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& queue = queues_[{src, dst, tag}];
    arrived_.wait(lock, [&] { return !queue.empty(); });
    ASSERT_EQ(queue.front().size(), bytes);
    if (bytes) std::memcpy(data, queue.front().data(), bytes);
    queue.pop_front();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<unsigned char>>> queues_;
};

class ThreadTransport final : public PointToPoint {
 public:
  ThreadTransport(Mailboxes& boxes, int rank, int size) : PointToPoint(rank, size), boxes_(boxes) {}
  double timeout() const override { return 60; }
  void barrier(const char*) override { ADD_FAILURE() << "the ring needs no barrier"; }
  void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                int src, const char*, int step) override {
    ++exchanges;
    boxes_.post(rank(), dst, step, send, send_bytes);
    boxes_.take(src, rank(), step, recv, recv_bytes);
  }
  void send(const void* buf, size_t bytes, int dst, const char*, int step) override {
    ++exchanges;
    boxes_.post(rank(), dst, step, buf, bytes);
  }
  void recv(void* buf, size_t bytes, int src, const char*, int step) override {
    ++exchanges;
    boxes_.take(src, rank(), step, buf, bytes);
  }
  int exchanges = 0;

 private:
  Mailboxes& boxes_;
};

TEST(Transport, RingAllreduceOverThreadsIsExactIn2NMinus1Exchanges) {
  for (int n : {1, 2, 5}) {
    const size_t count = 1031;  // not a multiple of n: blocks differ by one
    Mailboxes boxes;
    std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(count));
    std::vector<int> exchanges(static_cast<size_t>(n));
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r) {
      auto& mine = data[static_cast<size_t>(r)];
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(check::value(r, i));
      ranks.emplace_back([&, r] {
        ThreadTransport transport(boxes, r, n);
        algo::ring_allreduce(transport, data[static_cast<size_t>(r)].data(), count, DType::f32,
                             ReduceOp::sum);
        exchanges[static_cast<size_t>(r)] = transport.exchanges;
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < n; ++r) {
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i)
        wrong +=
            data[static_cast<size_t>(r)][i] != check::expected(i, n, DType::f32, ReduceOp::sum);
      EXPECT_EQ(wrong, 0u) << "rank " << r << " of " << n;
      EXPECT_EQ(exchanges[static_cast<size_t>(r)], 2 * (n - 1)) << "rank " << r << " of " << n;
    }
  }
}

}  // namespace
}  // namespace anvil::comm
