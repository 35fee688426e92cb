#include "anvil/parallel/expert_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "anvil/base/clock.hpp"
#include "anvil/base/error.hpp"

namespace anvil::parallel {
namespace {

void at_least(std::vector<float>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}

}  // namespace

AllToAllExperts::AllToAllExperts(comm::Communicator& group, const model::ZayaMoeShape& shape,
                                 int64_t rows, std::shared_ptr<Scratch> scratch)
    : group_(group),
      s_(shape),
      K_(group.size()),
      rank_(group.rank()),
      owns_scratch_(scratch == nullptr),
      scratch_(scratch ? std::move(scratch) : std::make_shared<Scratch>()) {
  if (s_.experts % K_ != 0) {
    throw InputError("--ep: " + std::to_string(K_) + " does not divide the " +
                     std::to_string(s_.experts) + " experts (expected a divisor of n_experts)");
  }
  per_ = s_.experts / K_;
  counts_.assign(static_cast<size_t>(K_ * s_.experts), 0);
  for (auto* v : {&send_counts_, &send_offsets_, &recv_counts_, &recv_offsets_}) {
    v->assign(static_cast<size_t>(K_), 0);
  }
  seg_.assign(static_cast<size_t>(per_ + 1), 0);
  const int64_t H = s_.hidden, F = s_.expert_ffn;
  for (auto* v : {&scratch_->recv, &scratch_->in, &scratch_->out, &xr_}) at_least(*v, rows * H);
  at_least(y_, rows * 2 * F);
  at_least(act_, rows * F);
}

template <typename Copy>
void AllToAllExperts::each_block(Copy copy) const {
  const int64_t H = s_.hidden, E = s_.experts;
  for (int64_t j = 0; j < per_; ++j) {
    int64_t grouped = seg_[j];
    for (int k = 0; k < K_; ++k) {
      int64_t received = static_cast<int64_t>(recv_offsets_[k]) / H;
      for (int64_t i = 0; i < j; ++i) received += counts_[k * E + rank_ * per_ + i];
      const int64_t n = counts_[k * E + rank_ * per_ + j];
      copy(grouped * H, received * H, static_cast<size_t>(n * H) * sizeof(float));
      grouped += n;
    }
  }
}

void AllToAllExperts::to_owners(const float* in, std::vector<float>& out) {
  const double t0 = now_seconds();
  float* recv = scratch_->recv.data();
  group_.alltoallv(in, send_counts_.data(), send_offsets_.data(), recv, recv_counts_.data(),
                   recv_offsets_.data(), comm::DType::f32, comm::Algo::automatic);
  comm_seconds_ += now_seconds() - t0;
  at_least(out, seg_[per_] * s_.hidden);
  each_block([&](int64_t grouped, int64_t received, size_t bytes) {
    std::memcpy(out.data() + grouped, recv + received, bytes);
  });
}

void AllToAllExperts::from_owners(const float* in, float* out) {
  float* recv = scratch_->recv.data();
  each_block([&](int64_t grouped, int64_t received, size_t bytes) {
    std::memcpy(recv + received, in + grouped, bytes);
  });
  const double t0 = now_seconds();
  // The way back: what came from rank k returns to it.
  group_.alltoallv(recv, recv_counts_.data(), recv_offsets_.data(), out, send_counts_.data(),
                   send_offsets_.data(), comm::DType::f32, comm::Algo::automatic);
  comm_seconds_ += now_seconds() - t0;
}

void AllToAllExperts::forward(float* ys, const float* xs, const int64_t* offsets,
                              const model::ZayaMoeParams& p) {
  const int64_t H = s_.hidden, E = s_.experts, F = s_.expert_ffn;
  // Everyone's rows per expert: the layout of both exchanges.
  int64_t* mine = counts_.data() + rank_ * E;
  for (int64_t e = 0; e < E; ++e) mine[e] = offsets[e + 1] - offsets[e];
  const double t0 = now_seconds();
  group_.allgather(mine, counts_.data(), counts_.size(), comm::DType::i64, comm::Algo::automatic);
  comm_seconds_ += now_seconds() - t0;
  int64_t received = 0;
  for (int k = 0; k < K_; ++k) {
    const int64_t first = offsets[k * per_], last = offsets[(k + 1) * per_];
    send_offsets_[k] = static_cast<size_t>(first * H);
    send_counts_[k] = static_cast<size_t>((last - first) * H);
    int64_t rows = 0;
    for (int64_t j = 0; j < per_; ++j) rows += counts_[k * E + rank_ * per_ + j];
    recv_offsets_[k] = static_cast<size_t>(received * H);
    recv_counts_[k] = static_cast<size_t>(rows * H);
    received += rows;
  }
  seg_[0] = 0;
  for (int64_t j = 0; j < per_; ++j) {
    int64_t rows = 0;
    for (int k = 0; k < K_; ++k) rows += counts_[k * E + rank_ * per_ + j];
    seg_[j + 1] = seg_[j] + rows;
  }
  at_least(scratch_->recv, received * H);
  to_owners(xs, xr_);
  at_least(y_, received * 2 * F);
  at_least(act_, received * F);
  std::vector<float>& yr = scratch_->out;
  at_least(yr, received * H);
  model::experts_forward(yr.data(), y_.data(), act_.data(), xr_.data(), seg_.data(), per_, s_, p,
                         low_, bf16_scratch(received));
  from_owners(yr.data(), ys);
}

void AllToAllExperts::backward(float* dxs, const model::ZayaMoeParams& g, const float* dys,
                               const model::ZayaMoeParams& p, std::vector<float>& dy,
                               std::vector<float>& dact) {
  const int64_t H = s_.hidden, F = s_.expert_ffn, rows = seg_[per_];
  std::vector<float>&dyr = scratch_->in, &dxr = scratch_->out;
  to_owners(dys, dyr);
  at_least(dy, rows * 2 * F);
  at_least(dact, rows * F);
  at_least(dxr, rows * H);
  std::fill(dxr.begin(), dxr.begin() + rows * H, 0.0f);
  model::experts_backward(dxr.data(), dy.data(), dact.data(), g, dyr.data(), xr_.data(), y_.data(),
                          act_.data(), seg_.data(), per_, s_, p, low_, bf16_scratch(rows));
  from_owners(dxr.data(), dxs);
}

size_t AllToAllExperts::bytes() const {
  size_t n = 0;
  for (const auto* v : {&xr_, &y_, &act_}) n += v->size();
  return n * sizeof(float) + (owns_scratch_ ? scratch_->bytes() : 0) +
         (low_a_.size() + low_b_.size()) * sizeof(bf16);
}

kernels::Bf16Scratch* AllToAllExperts::bf16_scratch(int64_t rows) {
  if (low_ == nullptr || low_->copy == nullptr) return nullptr;
  // Its own: the rows received vary with the routing (the model's scratch is
  // sized for the rank's own assignments).
  const auto need = static_cast<size_t>(model::experts_bf16_scratch(s_, rows));
  if (low_a_.size() < need) {
    low_a_.resize(need);
    low_b_.resize(need);
  }
  low_scratch_own_ = {low_a_.data(), low_b_.data(), static_cast<int64_t>(low_a_.size())};
  return &low_scratch_own_;
}

double AllToAllExperts::take_comm_seconds() {
  const double s = comm_seconds_;
  comm_seconds_ = 0;
  return s;
}

}  // namespace anvil::parallel
