#include "anvil/parallel/grad_reducer.hpp"

#include <algorithm>
#include <stdexcept>

#include "anvil/base/clock.hpp"

namespace anvil::parallel {

GradReducer::GradReducer(comm::AsyncCommunicator& comm, float* grads, int64_t total,
                         int64_t bucket_floats, bool scatter_only, comm::Algo algo,
                         const std::vector<ReduceRange>& other)
    : grads_(grads), scatter_only_(scatter_only), algo_(algo) {
  if (bucket_floats < 1) throw std::invalid_argument("GradReducer: bucket size must be >= 1");
  // The arena as ranges of one group each, then buckets cut from each
  // range's end, last range first.
  std::vector<Bucket> ranges;
  int64_t at = 0;
  for (const ReduceRange& r : other) {
    if (r.begin < at || r.end <= r.begin || r.end > total || r.comm == nullptr)
      throw std::invalid_argument("GradReducer: reduce ranges must be ascending and inside");
    if (r.begin > at) ranges.push_back({at, r.begin, &comm});
    ranges.push_back({r.begin, r.end, r.comm});
    at = r.end;
  }
  if (at < total) ranges.push_back({at, total, &comm});
  for (size_t i = ranges.size(); i-- > 0;) {
    for (int64_t end = ranges[i].end; end > ranges[i].begin; end -= bucket_floats) {
      buckets_.push_back({std::max(ranges[i].begin, end - bucket_floats), end, ranges[i].comm});
    }
  }
  seconds_.assign(buckets_.size(), 0.0);
}

void GradReducer::begin() {
  if (started_ != 0 && !requests_.empty())
    throw std::logic_error("GradReducer: begin() before the last finish()");
  started_ = 0;
  requests_.clear();
  std::fill(seconds_.begin(), seconds_.end(), 0.0);
}

void GradReducer::ready_from(int64_t offset) {
  while (started_ < buckets_.size() && buckets_[started_].begin >= offset) {
    const size_t i = started_++;
    const Bucket& b = buckets_[i];
    if (b.comm->size() == 1) continue;  // a group of one: its sum is its own
    float* data = grads_ + b.begin;
    const auto count = static_cast<size_t>(b.end - b.begin);
    double* seconds = &seconds_[i];
    const comm::Algo algo = algo_;
    const bool scatter_only = scatter_only_;
    requests_.push_back(
        b.comm->start([data, count, seconds, algo, scatter_only](comm::Communicator& c) {
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
  for (size_t i = buckets_.size(); i-- > 0;) {
    const Bucket& b = buckets_[i];
    const auto count = static_cast<size_t>(b.end - b.begin);
    const int size = b.comm->size(), rank = b.comm->rank();
    const auto off = static_cast<int64_t>(comm::block_offset(count, size, rank));
    const auto n = static_cast<int64_t>(comm::block_count(count, size, rank));
    if (n <= 0) continue;
    if (!out.empty() && out.back().second == b.begin + off) {
      out.back().second += n;  // a group of one owns its whole bucket: merge
    } else {
      out.emplace_back(b.begin + off, b.begin + off + n);
    }
  }
  return out;
}

void GradReducer::gather(float* data) {
  std::vector<comm::CommRequest> requests;
  for (const Bucket& b : buckets_) {
    if (b.comm->size() == 1) continue;
    float* d = data + b.begin;
    const auto count = static_cast<size_t>(b.end - b.begin);
    const comm::Algo algo = algo_;
    requests.push_back(b.comm->start([d, count, algo](comm::Communicator& c) {
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

}  // namespace anvil::parallel
