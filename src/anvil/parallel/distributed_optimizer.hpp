// The optimizer step of a data-parallel run: the gradients reduced over the
// ranks in buckets while the step's last backward runs, the global gradient
// norm, AdamW (ZeRO-1: each rank updates its blocks, then the weights are
// all-gathered) and Muon (each matrix orthogonalised and updated by its
// owner, then broadcast from there). On one process it is AdamW and Muon
// over the whole arena, with the same arithmetic. On a model whose arrays
// live on a device (TrainableModel::device_arrays) it steps there
// (optim/device_adamw.hpp, optim/device_muon.hpp), the host optimizers its
// checkpoint mirrors; data parallel then sums each layer's gradients on the
// devices while backward goes on, with NCCL on a stream of its own: by an
// all-reduce, or with ZeRO-1 by a reduce of each rank's part to that rank,
// whose block is updated there and broadcast back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "anvil/device/collectives.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/model/trainable.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/device_adamw.hpp"
#include "anvil/optim/device_muon.hpp"
#include "anvil/optim/muon.hpp"
#include "anvil/optim/optimizer_options.hpp"
#include "anvil/parallel/grad_reducer.hpp"
#include "anvil/parallel/parallel_options.hpp"

namespace anvil::parallel {

class DataParallelGroup;

class DistributedOptimizer {
 public:
  using Range = std::pair<int64_t, int64_t>;
  // `dp` null or of one rank: a single process.
  DistributedOptimizer(model::TrainableModel& model, const optim::OptimizerOptions& options,
                       const ParallelOptions& parallel, DataParallelGroup* dp);
  ~DistributedOptimizer();

  // After each of a step's micro-batches but the last: its gradients join
  // the step's earlier ones (`first`: they start the sum), on the device
  // when the step runs there (the gradients never leave it), else on the host.
  void keep_earlier(bool first);
  // Around the step's last backward: its gradients go to the reduction as
  // backward finishes them. `with_earlier`: keep_earlier ran this step; each
  // range is then added to (earlier + last) as it finishes, before it is
  // handed over: the sum two ranks' reduction makes of one micro-batch each,
  // so one rank with two micro-batches gets the same bits.
  void start_reduction(bool with_earlier = false);
  void stop_handing_over();
  // Waits for the whole reduction (zero times on one process).
  ReduceTimes finish_reduction();
  // The norm of the summed gradients, the same bits on every rank.
  double grad_norm();
  // Step `step` (from 1) at learning rate `lr`, gradients scaled by `coef`.
  void update(float lr, float coef, int64_t step);

  // The arena ranges this rank writes to a checkpoint (its reducer blocks;
  // the whole arena on one process).
  std::vector<Range> owned() const;
  // The optimizer state this rank writes (within `owned()`) or reads (all it keeps).
  std::vector<model::TensorShard> state_to_save();
  std::vector<model::TensorShard> state_to_load();
  size_t state_bytes() const;
  int64_t bucket_count() const { return reducer_ ? reducer_->bucket_count() : 0; }
  // Whether a model on a device is stepped there with these options
  // (no experts; AdamW with or without ZeRO-1, Muon without).
  static bool steps_on_device(const optim::OptimizerOptions& options,
                              const ParallelOptions& parallel);
  // Whether the step runs on the model's device.
  bool on_device() const { return device_ != nullptr; }

 private:
  void add_earlier_from(int64_t offset);
  // The ranks' blocks of the arena for the device step (size + 1 offsets).
  std::vector<size_t> block_offsets() const;
  void broadcast_muon_matrices(float* data);

  model::TrainableModel& model_;
  DataParallelGroup* dp_;
  int ep_;
  // The earlier micro-batches' summed gradients (host_earlier_'s data, or
  // null); added already at offsets >= finished_from_.
  const float* earlier_ = nullptr;
  std::vector<float> host_earlier_;
  int64_t finished_from_ = 0;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<optim::AdamW> adamw_;
  std::unique_ptr<optim::Muon> muon_;
  // The device step: its optimizer, the moments' side that is newer
  // (a load fills the mirror), and the earlier micro-batches' sum there.
  std::unique_ptr<optim::DeviceAdamW> device_;
  std::unique_ptr<optim::DeviceMuon> device_muon_;  // with Muon
  bool mirror_newer_ = false;
  device::DeviceArena earlier_arena_;
  float* device_earlier_ = nullptr;
  bool device_has_earlier_ = false;                  // this step's device_earlier_ is to be added
  std::unique_ptr<device::DeviceCollectives> nccl_;  // data parallel on GPUs
  // Data parallel on devices: each range of gradients is reduced as
  // backward queues it (reduce_on_device_from), on GPUs on comm_stream_ once
  // the compute stream passes `ready_` (all-reduced, or with ZeRO-1 reduced
  // to the ranks whose blocks it meets; the CPU device all-reduces).
  void reduce_on_device_from(int64_t offset);
  void make_device_earlier();
  bool overlapped() const { return device_ && dp_; }
  device::Stream comm_stream_;
  device::Event ready_;
  // Per bucket of this step (grown to the most buckets a step has had): its
  // reduction's start and end on comm_stream_; their sum is the step's
  // communication time.
  std::vector<std::pair<device::Event, device::Event>> bucket_events_;
  int64_t buckets_ = 0;
  double reduce_seconds_ = 0;  // the CPU device's reductions, run as they come
  // The gradient norm's fixed-point scale at the last step (optim/square_sum.hpp):
  // on the CPU the next norm guesses it and reads the gradients once.
  std::optional<int> norm_scale_;
};

}  // namespace anvil::parallel
