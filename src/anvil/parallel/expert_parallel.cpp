// The all-to-all token dispatcher: the exchange's layout from the
// all-gathered per-expert row counts, the two alltoallv legs and the
// regrouping of received rows by local expert, forward and backward.
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

size_t AllToAllDispatcher::Scratch::bytes() const {
  size_t n = 0;
  for (const auto* v : {&recv, &in, &out, &dfc1, &dact}) n += v->size();
  return n * sizeof(float);
}

AllToAllDispatcher::AllToAllDispatcher(comm::Communicator& group, const model::ZayaMoeShape& shape,
                                       int64_t tokens, std::shared_ptr<Scratch> scratch)
    : TokenDispatcher(shape, tokens),
      group_(group),
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
  const int64_t H = s_.hidden, F = s_.expert_ffn, rows = tokens * s_.top_k;
  for (auto* v : {&scratch_->recv, &scratch_->in, &scratch_->out, &xr_}) at_least(*v, rows * H);
  at_least(y_, rows * 2 * F);
  at_least(act_, rows * F);
  at_least(scratch_->dfc1, rows * 2 * F);
  at_least(scratch_->dact, rows * F);
}

template <typename Copy>
void AllToAllDispatcher::each_block(Copy copy) const {
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

void AllToAllDispatcher::to_owners(const float* in, std::vector<float>& out) {
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

void AllToAllDispatcher::from_owners(const float* in, float* out) {
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

void AllToAllDispatcher::plan_exchange() {
  const int64_t H = s_.hidden, E = s_.experts;
  int64_t* mine = counts_.data() + rank_ * E;
  for (int64_t e = 0; e < E; ++e) mine[e] = offsets_[e + 1] - offsets_[e];
  const double t0 = now_seconds();
  group_.allgather(mine, counts_.data(), counts_.size(), comm::DType::i64, comm::Algo::automatic);
  comm_seconds_ += now_seconds() - t0;
  int64_t received = 0;
  for (int k = 0; k < K_; ++k) {
    const int64_t first = offsets_[k * per_], last = offsets_[(k + 1) * per_];
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
}

void AllToAllDispatcher::send() {
  const int64_t H = s_.hidden, F = s_.expert_ffn;
  plan_exchange();
  const int64_t received = seg_[per_];
  at_least(scratch_->recv, received * H);
  to_owners(xs_, xr_);
  at_least(y_, received * 2 * F);
  at_least(act_, received * F);
  at_least(scratch_->out, received * H);
  rows_.experts = per_;
  rows_.offsets = seg_.data();
  rows_.x = xr_.data();
  rows_.y = scratch_->out.data();
  rows_.fc1 = y_.data();
  rows_.act = act_.data();
  rows_.bf16 = bf16_scratch(received);
}

void AllToAllDispatcher::receive() {
  from_owners(scratch_->out.data(), ys_);
}

void AllToAllDispatcher::send_grads(const float* dys, float* /*dxs*/) {
  const int64_t H = s_.hidden, F = s_.expert_ffn, rows = seg_[per_];
  std::vector<float>&dyr = scratch_->in, &dxr = scratch_->out;
  to_owners(dys, dyr);
  at_least(scratch_->dfc1, rows * 2 * F);
  at_least(scratch_->dact, rows * F);
  at_least(dxr, rows * H);
  grads_.dy = dyr.data();
  grads_.dx = dxr.data();
  grads_.dfc1 = scratch_->dfc1.data();
  grads_.dact = scratch_->dact.data();
  rows_.bf16 = bf16_scratch(rows);
}

void AllToAllDispatcher::receive_grads(float* dxs) {
  from_owners(scratch_->out.data(), dxs);
}

size_t AllToAllDispatcher::heap_bytes() const {
  size_t n = 0;
  for (const auto* v : {&xr_, &y_, &act_}) n += v->size();
  return n * sizeof(float) + (owns_scratch_ ? scratch_->bytes() : 0) +
         (low_a_.size() + low_b_.size()) * sizeof(bf16);
}

kernels::Bf16Scratch* AllToAllDispatcher::bf16_scratch(int64_t rows) {
  if (bf16_scratch_ == nullptr) return nullptr;
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

double AllToAllDispatcher::take_comm_seconds() {
  const double s = comm_seconds_;
  comm_seconds_ = 0;
  return s;
}

}  // namespace anvil::parallel
