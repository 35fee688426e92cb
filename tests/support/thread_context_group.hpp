// A context group of C threads in one process (model/context_parallel.hpp's
// ContextGroup over shared memory), so that layer-level context-parallel
// tests run without MPI: run_ranks(C, f) calls f(group) on C threads, each
// with its own group member and one OpenMP thread.
#pragma once

#include <omp.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "anvil/model/context_parallel.hpp"

namespace anvil::test_support {

class ThreadContextGroup final : public model::ContextGroup {
 public:
  struct Shared {
    explicit Shared(int n) : size(n), sync(n), posted(static_cast<size_t>(n)) {}
    int size;
    std::barrier<> sync;
    std::vector<const float*> posted;
    std::mutex mutex;
    std::map<std::tuple<int, int, int>, std::vector<float>> mail;  // (from, to, tag)
  };
  ThreadContextGroup(Shared& shared, int rank) : s_(shared), rank_(rank) {}
  int size() const override { return s_.size; }
  int rank() const override { return rank_; }
  void allgather(const float* send, float* recv, size_t count) override {
    s_.posted[static_cast<size_t>(rank_)] = send;
    s_.sync.arrive_and_wait();
    for (int q = 0; q < s_.size; ++q)
      std::memcpy(recv + q * count, s_.posted[static_cast<size_t>(q)], count * sizeof(float));
    s_.sync.arrive_and_wait();
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    s_.posted[static_cast<size_t>(rank_)] = send;
    s_.sync.arrive_and_wait();
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (int q = 0; q < s_.size; ++q) sum += s_.posted[static_cast<size_t>(q)][rank_ * count + i];
      recv[i] = sum;
    }
    s_.sync.arrive_and_wait();
  }
  void exchange(std::span<const Message> sends, std::span<const Message> recvs) override {
    {
      const std::lock_guard<std::mutex> lock(s_.mutex);
      for (const Message& m : sends)
        s_.mail[{rank_, m.peer, m.tag}] = std::vector<float>(m.data, m.data + m.count);
    }
    s_.sync.arrive_and_wait();
    {
      const std::lock_guard<std::mutex> lock(s_.mutex);
      for (const Message& m : recvs) {
        const auto& v = s_.mail.at({m.peer, rank_, m.tag});
        std::copy_n(v.data(), std::min(v.size(), m.count), m.data);
      }
    }
    s_.sync.arrive_and_wait();
    if (rank_ == 0) {
      const std::lock_guard<std::mutex> lock(s_.mutex);
      s_.mail.clear();
    }
    s_.sync.arrive_and_wait();
  }

 private:
  Shared& s_;
  int rank_;
};

// f(group) on `ranks` threads; rethrows the first exception.
inline void run_ranks(int ranks, const std::function<void(ThreadContextGroup&)>& f) {
  ThreadContextGroup::Shared shared(ranks);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(1);
      ThreadContextGroup group(shared, r);
      try {
        f(group);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace anvil::test_support
