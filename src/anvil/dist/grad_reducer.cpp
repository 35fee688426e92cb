#include "anvil/dist/grad_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace anvil::dist {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

GradReducer::GradReducer(comm::AsyncCommunicator& comm, float* grads, int64_t total,
                         int64_t bucket_floats, comm::Algo algo)
    : comm_(comm), grads_(grads), total_(total), algo_(algo) {
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
    requests_.push_back(comm_.start([data, count, seconds, algo](comm::Communicator& c) {
      const double t0 = now();
      c.allreduce(data, data, count, comm::DType::f32, comm::ReduceOp::sum, algo);
      *seconds = now() - t0;
    }));
  }
}

ReduceTimes GradReducer::finish() {
  ready_from(0);
  const double t0 = now();
  for (auto& r : requests_) r.wait();
  ReduceTimes t;
  t.exposed_seconds = now() - t0;
  for (double s : seconds_) t.comm_seconds += s;
  t.buckets = static_cast<int64_t>(requests_.size());
  requests_.clear();
  started_ = 0;
  return t;
}

}  // namespace anvil::dist
