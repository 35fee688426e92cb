#include "anvil/parallel/distributed_optimizer.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "anvil/base/clock.hpp"
#include "anvil/kernels/device_layers.hpp"
#include "anvil/optim/square_sum.hpp"
#include "anvil/parallel/data_parallel.hpp"

namespace anvil::parallel {
namespace {

// Under expert parallelism the experts' gradients (one range per MoE layer)
// are summed over the ranks holding the same experts only.
std::vector<ReduceRange> expert_ranges(const model::ParamRegistry& registry,
                                       DataParallelGroup& dp) {
  std::vector<ReduceRange> ranges;
  for (const auto& spec : registry.specs()) {
    if (spec.sharding != model::Sharding::expert) continue;
    if (!ranges.empty() && ranges.back().end == spec.offset) {
      ranges.back().end += spec.numel;
    } else {
      ranges.push_back({spec.offset, spec.offset + spec.numel, &dp.expert_data_async()});
    }
  }
  return ranges;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(model::TrainableModel& model,
                                           const optim::OptimizerOptions& options,
                                           const ParallelOptions& parallel, DataParallelGroup* dp)
    : model_(model), dp_(dp && dp->size() > 1 ? dp : nullptr), ep_(parallel.ep) {
  const bool use_muon = options.name == "muon";
  const auto& registry = model.registry();
  // A model on a device steps there (optim/device_adamw.hpp, and with Muon
  // optim/device_muon.hpp), its gradients summed on the devices (NCCL; MPI
  // on the CPU device): all-reduced, or with ZeRO-1 (AdamW only) reduced to
  // each rank's block of the arena, which it updates before the blocks are
  // gathered. Muon with ZeRO-1, and experts, run on host copies.
  const auto* arrays = model.device_arrays();
  const bool device_step = arrays && steps_on_device(options, parallel);
  if (dp_ && !device_step) {
    reducer_ = std::make_unique<GradReducer>(
        dp_->async(), model.grads(), registry.total(),
        std::max<int64_t>(1, static_cast<int64_t>(parallel.bucket_mib * (1 << 20) / sizeof(float))),
        // With Muon a matrix is updated whole by its owner, so every rank
        // needs every summed gradient: the buckets are all-gathered too.
        parallel.zero && !use_muon, comm::Algo::automatic,
        ep_ > 1 ? expert_ranges(registry, *dp_) : std::vector<ReduceRange>{});
  }
  std::vector<optim::AdamW::Range> shard;
  if (reducer_ && parallel.zero) shard = reducer_->owned();
  if (device_step && dp_ && parallel.zero) shard = owned();
  adamw_ =
      std::make_unique<optim::AdamW>(registry, options.adamw, /*skip_muon_group=*/use_muon, shard);
  if (use_muon) {
    // One --weight-decay for both optimizers.
    optim::MuonConfig muon = options.muon;
    muon.weight_decay = options.adamw.weight_decay;
    muon_ = std::make_unique<optim::Muon>(registry, muon, dp_ ? dp_->rank() : 0,
                                          dp_ ? dp_->size() : 1, std::max(1, ep_));
  }
  if (device_step) {
    device_ = std::make_unique<optim::DeviceAdamW>(*adamw_, *arrays->stream);
    if (muon_) device_muon_ = std::make_unique<optim::DeviceMuon>(*muon_, *arrays->stream);
    model.keep_grads_on_device();
    if (dp_ && arrays->stream->kind() == device::DeviceKind::cuda) {
      MPI_Comm mpi = dp_->comm().mpi_comm();
      nccl_ = std::make_unique<device::DeviceCollectives>(
          dp_->rank(), dp_->size(), device::gpu_for_rank(dp_->rank()),
          [mpi](void* bytes, size_t n) {
            MPI_Bcast(bytes, static_cast<int>(n), MPI_BYTE, 0, mpi);
          });
      comm_stream_ = device::Stream(device::DeviceKind::cuda);
      ready_ = device::Event(device::DeviceKind::cuda);
    }
  }
}

DistributedOptimizer::~DistributedOptimizer() = default;

bool DistributedOptimizer::steps_on_device(const optim::OptimizerOptions& options,
                                           const ParallelOptions& parallel) {
  // Muon needs every summed gradient of a matrix on its owner: no ZeRO-1.
  return (options.name == "adamw" || (options.name == "muon" && !parallel.zero)) &&
         parallel.ep <= 1;
}

std::vector<size_t> DistributedOptimizer::block_offsets() const {
  const auto total = static_cast<size_t>(model_.registry().total());
  std::vector<size_t> offsets;
  for (int p = 0; p <= dp_->size(); ++p)
    offsets.push_back(comm::block_offset(total, dp_->size(), p));
  return offsets;
}

void DistributedOptimizer::keep_earlier(bool first) {
  const int64_t n = model_.registry().total();
  if (device_) {  // queued on the stream before the next micro-batch zeroes the gradients
    const auto* arrays = model_.device_arrays();
    make_device_earlier();
    if (first) {
      device::copy(device_earlier_, arrays->grads, static_cast<size_t>(n) * sizeof(float),
                   device::CopyKind::device_to_device, *arrays->stream);
    } else {  // earlier = earlier + grads, element-wise as the host's sum
      kernels::dev::residual_forward(*arrays->stream, device_earlier_, device_earlier_,
                                     arrays->grads, n);
    }
    return;
  }
  const float* g = model_.grads();
  host_earlier_.resize(static_cast<size_t>(n));
  float* e = host_earlier_.data();
  if (first) {
    std::copy(g, g + n, e);
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) e[i] = e[i] + g[i];
  }
}

void DistributedOptimizer::start_reduction(bool with_earlier) {
  if (device_) {  // backward's gradients are queued on the device when it hands them over
    device_has_earlier_ = with_earlier;
    if (!overlapped()) return;
    finished_from_ = model_.registry().total();
    buckets_ = 0;
    reduce_seconds_ = 0;
    model_.set_grads_ready_hook([this](int64_t offset) { reduce_on_device_from(offset); });
    return;
  }
  if (reducer_) reducer_->begin();
  const float* earlier = with_earlier ? host_earlier_.data() : nullptr;
  if (!reducer_ && !earlier) return;
  earlier_ = earlier;
  finished_from_ = model_.registry().total();
  model_.set_grads_ready_hook([this](int64_t offset) {
    add_earlier_from(offset);
    if (reducer_) reducer_->ready_from(offset);
  });
}

void DistributedOptimizer::make_device_earlier() {
  if (device_earlier_) return;
  const auto* arrays = model_.device_arrays();
  const int64_t n = model_.registry().total();
  device::ArenaPlan plan;
  plan.add(static_cast<size_t>(n) * sizeof(float));
  earlier_arena_ = device::DeviceArena(arrays->stream->kind(), "earlier gradients", plan);
  device_earlier_ = earlier_arena_.take<float>(n);
}

void DistributedOptimizer::reduce_on_device_from(int64_t offset) {
  if (offset >= finished_from_) return;
  const auto* arrays = model_.device_arrays();
  float* g = arrays->grads + offset;
  const int64_t n = finished_from_ - offset;
  // grads = earlier + grads over the range, element-wise (add_earlier_from's sum).
  if (device_has_earlier_)
    kernels::dev::residual_forward(*arrays->stream, g, device_earlier_ + offset, g, n);
  if (nccl_) {
    ready_.record(*arrays->stream);
    comm_stream_.wait(ready_);
    // The bucket's own time: from the comm stream passing the wait (not
    // its idle time before, while backward computes) to its collective's end.
    if (static_cast<size_t>(buckets_) == bucket_events_.size())
      bucket_events_.emplace_back(device::Event(device::DeviceKind::cuda),
                                  device::Event(device::DeviceKind::cuda));
    auto& [bucket_start, bucket_stop] = bucket_events_[static_cast<size_t>(buckets_)];
    bucket_start.record(comm_stream_);
    if (adamw_->sharded()) {
      // ZeRO-1: the range's part of each rank's block summed to that rank
      // (the blocks clipped to the range; empty ones are skipped).
      std::vector<size_t> clipped = block_offsets();
      for (size_t& o : clipped)
        o = std::clamp(o, static_cast<size_t>(offset), static_cast<size_t>(finished_from_));
      nccl_->reduce_blocks(arrays->grads, clipped, Dtype::fp32, device::ReduceOp::sum,
                           comm_stream_);
    } else {
      nccl_->all_reduce(g, g, static_cast<size_t>(n), Dtype::fp32, device::ReduceOp::sum,
                        comm_stream_);
    }
    bucket_stop.record(comm_stream_);
  } else {  // the CPU device: the stream's work is done; reduce now (with
            // ZeRO-1 too: each rank then updates its block of the sums)
    const double t0 = now_seconds();
    dp_->comm().allreduce(g, g, static_cast<size_t>(n), comm::DType::f32, comm::ReduceOp::sum,
                          comm::Algo::automatic);
    reduce_seconds_ += now_seconds() - t0;
  }
  ++buckets_;
  finished_from_ = offset;
}

void DistributedOptimizer::add_earlier_from(int64_t offset) {
  if (earlier_) {
    float* g = model_.grads();
    const float* e = earlier_;
    // Element-wise: the threads' split does not change a bit.
#pragma omp parallel for simd schedule(static)
    for (int64_t i = offset; i < finished_from_; ++i) g[i] = e[i] + g[i];
  }
  finished_from_ = std::min(finished_from_, offset);
}

void DistributedOptimizer::stop_handing_over() {
  if (device_) {
    if (overlapped()) {
      reduce_on_device_from(0);  // backward's last call says 0; this only makes sure
      model_.set_grads_ready_hook({});
    } else if (device_has_earlier_) {  // grads = earlier + grads, as add_earlier_from
      const auto* arrays = model_.device_arrays();
      kernels::dev::residual_forward(*arrays->stream, arrays->grads, device_earlier_, arrays->grads,
                                     model_.registry().total());
    }
    device_has_earlier_ = false;
    return;
  }
  add_earlier_from(0);  // backward's last call says 0; this only makes sure
  earlier_ = nullptr;
  model_.set_grads_ready_hook({});
}

ReduceTimes DistributedOptimizer::finish_reduction() {
  if (overlapped()) {  // the layers' reductions were queued during backward
    const double t0 = now_seconds();
    if (nccl_) {
      comm_stream_.synchronize();
      const double exposed = now_seconds() - t0;
      double ms = 0;
      for (int64_t b = 0; b < buckets_; ++b) {
        const auto& [start, stop] = bucket_events_[static_cast<size_t>(b)];
        ms += device::Event::elapsed_ms(start, stop);
      }
      return {ms / 1e3, exposed, buckets_};
    }
    return {reduce_seconds_, reduce_seconds_, buckets_};  // the CPU device overlaps nothing
  }
  return reducer_ ? reducer_->finish() : ReduceTimes{};
}

double DistributedOptimizer::grad_norm() {
  const int64_t total = model_.registry().total();
  const float* g = device_ ? model_.device_arrays()->grads : model_.grads();
  // Every rank holds every summed gradient (no ZeRO shards, no experts of
  // its own): the norm is local, and the exact sum makes it the one-rank
  // run's bits.
  if (!adamw_->sharded() && (device_ || !reducer_ || ep_ <= 1))
    return device_ ? device_->global_norm(g, total) : optim::global_norm(g, total, &norm_scale_);
  // Otherwise each rank's owned blocks, in fixed point at the scale of the
  // largest magnitude anywhere: integer sums, the same bits on any layout.
  // On the CPU each block is also summed at the last step's scale and its
  // two neighbours in the same pass, kept where the scale is one of them.
  const auto ranges = owned();
  const bool guess = !device_ && norm_scale_.has_value();
  optim::MaxAndSquareSum guessed;  // its max unused: `mine` below
  if (guess) guessed.guess = *norm_scale_;
  float mine = 0.0f;
  for (const auto& [begin, end] : ranges) {
    float m;
    if (guess) {
      const auto part = optim::max_and_square_sum(g + begin, end - begin, *norm_scale_);
      for (int i = 0; i < 3; ++i) optim::add(guessed.sums[i], part.sums[i]);
      m = part.max;
    } else {
      m = device_ ? device_->max_abs(g + begin, end - begin)
                  : optim::max_abs(g + begin, end - begin);
    }
    // A NaN in any range stays NaN (a later finite range must not hide it).
    mine = std::isnan(m) || std::isnan(mine) ? std::numeric_limits<float>::quiet_NaN()
                                             : std::max(mine, m);
  }
  float largest = 0.0f;
  for (double m : dp_->gather(static_cast<double>(mine)))
    largest = std::isnan(m) || std::isnan(largest) ? std::numeric_limits<float>::quiet_NaN()
                                                  : std::max(largest, static_cast<float>(m));
  if (!(largest > 0)) return std::isnan(largest) ? static_cast<double>(largest) : 0.0;
  const int scale = optim::square_scale(largest);
  optim::SquareSum sum;
  if (const optim::SquareSum* at = guess ? guessed.at(scale) : nullptr) {
    sum = *at;
  } else {
    for (const auto& [begin, end] : ranges)
      optim::add(sum, device_ ? device_->square_sum(g + begin, end - begin, scale)
                              : optim::scaled_square_sum(g + begin, end - begin, scale));
  }
  if (!device_) norm_scale_ = scale;
  dp_->sum(std::span<int64_t>(sum.limbs, 3));
  return std::sqrt(optim::square_sum_value(sum, scale));
}

void DistributedOptimizer::update(float lr, float coef, int64_t step) {
  if (device_) {
    if (mirror_newer_) {
      device_->upload();
      if (device_muon_) device_muon_->upload();
    }
    mirror_newer_ = false;
    const auto* arrays = model_.device_arrays();
    device_->update(arrays->params, arrays->grads, lr, step, coef);
    if (device_muon_) {
      device_muon_->update(arrays->params, arrays->grads, lr, coef);
      if (dp_) broadcast_muon_matrices(arrays->params);
    }
    if (adamw_->sharded()) {  // ZeRO-1: every rank's updated block to every rank
      if (nccl_) {
        nccl_->broadcast_blocks(arrays->params, block_offsets(), Dtype::fp32, *arrays->stream);
      } else {
        const auto n = static_cast<size_t>(model_.registry().total());
        dp_->comm().allgather(arrays->params + block_offsets()[dp_->rank()], arrays->params, n,
                              comm::DType::f32, comm::Algo::automatic);
      }
    }
    model_.params_written_on_device();
    return;
  }
  // bf16 training, every weight AdamW's here (not sharded, no Muon): its
  // update rewrites the model's bf16 copy too (taken before params()
  // marks it stale), so the next forward does not convert the weights.
  bf16* low = adamw_->sharded() || muon_ ? nullptr : model_.fresh_bf16_weights();
  adamw_->update(model_.params(), model_.grads(), lr, step, coef, low);
  if (low != nullptr) model_.bf16_weights_refreshed();
  if (adamw_->sharded()) reducer_->gather(model_.params());
  if (muon_) {
    muon_->update(model_.params(), model_.grads(), lr, coef);
    if (dp_) broadcast_muon_matrices(model_.params());
  }
}

void DistributedOptimizer::broadcast_muon_matrices(float* data) {
  // Each matrix was orthogonalised and updated by its owner, which alone
  // keeps its momentum; its weights go from there to every rank. Under
  // expert parallelism an expert's matrix lives on the ranks holding that
  // expert only, and goes out over their group (world rank r is r / ep there).
  // On GPUs (no expert parallelism there) NCCL broadcasts on the compute
  // stream, after the update that wrote the matrix.
  const auto& specs = model_.registry().specs();
  const auto& owners = muon_->owners();
  if (nccl_) {  // one NCCL group for all of them
    std::vector<device::DeviceCollectives::Piece> pieces;
    for (size_t i = 0; i < specs.size(); ++i)
      if (owners[i] >= 0)
        pieces.push_back(
            {static_cast<size_t>(specs[i].offset), static_cast<size_t>(specs[i].numel), owners[i]});
    nccl_->broadcast_pieces(data, pieces, Dtype::fp32, *model_.device_arrays()->stream);
    return;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (owners[i] < 0) continue;
    const auto n = static_cast<size_t>(specs[i].numel);
    if (ep_ > 1 && specs[i].sharding == model::Sharding::expert) {
      comm::Communicator& group = dp_->expert_data_group();
      if (group.size() > 1)
        group.broadcast(data + specs[i].offset, n, comm::DType::f32, owners[i] / ep_,
                        comm::Algo::automatic);
    } else {
      dp_->comm().broadcast(data + specs[i].offset, n, comm::DType::f32, owners[i],
                            comm::Algo::automatic);
    }
  }
}

std::vector<DistributedOptimizer::Range> DistributedOptimizer::owned() const {
  if (reducer_) return reducer_->owned();
  const auto total = static_cast<size_t>(model_.registry().total());
  if (!dp_) return {{0, static_cast<int64_t>(total)}};
  // The device step: each rank writes its block (and with ZeRO-1 updates it).
  const auto begin = static_cast<int64_t>(comm::block_offset(total, dp_->size(), dp_->rank()));
  return {
      {begin, begin + static_cast<int64_t>(comm::block_count(total, dp_->size(), dp_->rank()))}};
}

std::vector<model::TensorShard> DistributedOptimizer::state_to_save() {
  if (device_ && !mirror_newer_) {
    device_->download();
    if (device_muon_) device_muon_->download();
  }
  std::vector<model::TensorShard> pieces = adamw_->state(owned());
  if (muon_)
    for (auto& piece : muon_->state()) pieces.push_back(piece);
  return pieces;
}

std::vector<model::TensorShard> DistributedOptimizer::state_to_load() {
  mirror_newer_ = device_ != nullptr;  // the loader writes the mirror; the next update uploads it
  std::vector<model::TensorShard> pieces = adamw_->state();
  if (muon_)
    for (auto& piece : muon_->state()) pieces.push_back(piece);
  return pieces;
}

size_t DistributedOptimizer::state_bytes() const {
  return adamw_->state_bytes() + (muon_ ? muon_->state_bytes() : 0);  // on the device too
}

}  // namespace anvil::parallel
