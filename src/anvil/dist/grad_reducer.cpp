#include "anvil/dist/grad_reducer.hpp"

#include <algorithm>
#include <stdexcept>

#include "anvil/base/clock.hpp"

namespace anvil::dist {

GradReducer::GradReducer(comm::AsyncCommunicator& comm, float* grads, int64_t total,
                         int64_t bucket_floats, bool scatter_only, comm::Algo algo)
    : comm_(comm), grads_(grads), total_(total), scatter_only_(scatter_only), algo_(algo) {
  if (bucket_floats < 1) throw std::invalid_argument("GradReducer: bucket size must be >= 1");
  for (int64_t end = total; end > 0; end -= bucket_floats) {
    begins_.push_back(std::max<int64_t>(0, end - bucket_floats));
  }
  seconds_.assign(begins_.size(), 0.0);
}

void GradReducer::begin() {
  if (started_ != 0 && !requests_.empty())
    throw std::logic_error("GradReducer: begin() before the last finish()");
  started_ = 0;
  requests_.clear();
  std::fill(seconds_.begin(), seconds_.end(), 0.0);
}

void GradReducer::ready_from(int64_t offset) {
  while (started_ < begins_.size() && begins_[started_] >= offset) {
    const size_t i = started_++;
    const int64_t begin = begins_[i];
    const int64_t end = i == 0 ? total_ : begins_[i - 1];
    float* data = grads_ + begin;
    const auto count = static_cast<size_t>(end - begin);
    double* seconds = &seconds_[i];
    const comm::Algo algo = algo_;
    const bool scatter_only = scatter_only_;
    requests_.push_back(
        comm_.start([data, count, seconds, algo, scatter_only](comm::Communicator& c) {
          const double t0 = now_seconds();
          if (!scatter_only && !c.single_node() && algo == comm::Algo::automatic) {
            // Across nodes plain DP takes the hierarchical all-reduce (shm inside
            // a node, ring across): one pass over the network instead of two
            // library collectives with their per-call latency.
            c.allreduce(data, data, count, comm::DType::f32, comm::ReduceOp::sum, comm::Algo::hier);
          } else {
            float* mine = data + comm::block_offset(count, c.size(), c.rank());
            // On one node `automatic` is shm; across nodes ZeRO's halves run as
            // rings (the library's own carry ~10 ms of latency per call over TCP).
            const comm::Algo a =
                algo == comm::Algo::automatic && !c.single_node() ? comm::Algo::ring : algo;
            c.reduce_scatter(data, mine, count, comm::DType::f32, comm::ReduceOp::sum, a);
            if (!scatter_only) c.allgather(mine, data, count, comm::DType::f32, a);
          }
          *seconds = now_seconds() - t0;
        }));
  }
}

std::vector<std::pair<int64_t, int64_t>> GradReducer::owned() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = begins_.size(); i-- > 0;) {
    const int64_t begin = begins_[i], end = i == 0 ? total_ : begins_[i - 1];
    const auto count = static_cast<size_t>(end - begin);
    const auto off = static_cast<int64_t>(comm::block_offset(count, comm_.size(), comm_.rank()));
    const auto n = static_cast<int64_t>(comm::block_count(count, comm_.size(), comm_.rank()));
    if (n > 0) out.emplace_back(begin + off, begin + off + n);
  }
  return out;
}

void GradReducer::gather(float* data) {
  std::vector<comm::CommRequest> requests;
  for (size_t i = 0; i < begins_.size(); ++i) {
    const int64_t begin = begins_[i], end = i == 0 ? total_ : begins_[i - 1];
    float* d = data + begin;
    const auto count = static_cast<size_t>(end - begin);
    const comm::Algo algo = algo_;
    requests.push_back(comm_.start([d, count, algo](comm::Communicator& c) {
      const comm::Algo a =
          algo == comm::Algo::automatic && !c.single_node() ? comm::Algo::ring : algo;
      c.allgather(d + comm::block_offset(count, c.size(), c.rank()), d, count, comm::DType::f32, a);
    }));
  }
  for (auto& r : requests) r.wait();
}

ReduceTimes GradReducer::finish() {
  ready_from(0);
  const double t0 = now_seconds();
  for (auto& r : requests_) r.wait();
  ReduceTimes t;
  t.exposed_seconds = now_seconds() - t0;
  for (double s : seconds_) t.comm_seconds += s;
  t.buckets = static_cast<int64_t>(requests_.size());
  requests_.clear();
  started_ = 0;
  return t;
}

}  // namespace anvil::dist
