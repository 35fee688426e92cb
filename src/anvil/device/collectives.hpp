// Collectives between GPUs, one GPU per rank: NCCL behind the seam (RCCL in a
// HIP build). NCCL is loaded when first used (dlopen libnccl.so.2), so a
// binary built with CUDA runs where NCCL is not installed, and only the GPU
// collectives say it is missing.
//
// The communicator is made collectively: rank 0 draws NCCL's unique id and
// `broadcast_id` gives it to every rank (the MPI runtime's broadcast under
// mpirun; nothing on one rank).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "anvil/base/dtype.hpp"
#include "anvil/device/runtime.hpp"

namespace anvil::device {

enum class ReduceOp { sum, max, min, avg };

// NCCL's version ("2.28.9"), or empty with `why` set when it cannot be loaded.
std::string nccl_version(std::string* why = nullptr);

class DeviceCollectives {
 public:
  using BroadcastId = std::function<void(void* bytes, size_t count)>;
  // Uses GPU `ordinal` (cudaSetDevice). Throws SystemError when NCCL or the
  // GPU cannot be used.
  DeviceCollectives(int rank, int world, int ordinal, const BroadcastId& broadcast_id);
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Counts are elements of `type` (fp32, bf16, fp16, fp64, int32, int64).
  void all_reduce(const void* send, void* recv, size_t count, Dtype type, ReduceOp op,
                  Stream& stream);
  void reduce_scatter(const void* send, void* recv, size_t recv_count, Dtype type, ReduceOp op,
                      Stream& stream);
  void all_gather(const void* send, void* recv, size_t send_count, Dtype type, Stream& stream);
  void broadcast(const void* send, void* recv, size_t count, Dtype type, int root, Stream& stream);
  // Block p of `send` (count elements) goes to rank p, into block `rank` of its recv.
  void all_to_all(const void* send, void* recv, size_t count, Dtype type, Stream& stream);
  // In place over blocks of any sizes: block p is elements [offsets[p],
  // offsets[p + 1]) of `data` (world + 1 offsets). reduce_blocks leaves
  // block `rank` reduced over the ranks (the others hold partial sums);
  // broadcast_blocks gives every rank every rank's own block. One NCCL group
  // of reduces (broadcasts), one rooted at each rank: ZeRO-1's reduce-scatter
  // and all-gather where the blocks are not all of one size.
  void reduce_blocks(void* data, std::span<const size_t> offsets, Dtype type, ReduceOp op,
                     Stream& stream);
  void broadcast_blocks(void* data, std::span<const size_t> offsets, Dtype type, Stream& stream);
  // In place, one NCCL group: piece i (elements [offset, offset + count) of
  // `data`) goes from rank `root` to every rank. Every rank passes the same
  // pieces in the same order (Muon's matrices from their owners).
  struct Piece {
    size_t offset = 0, count = 0;
    int root = 0;
  };
  void broadcast_pieces(void* data, std::span<const Piece> pieces, Dtype type, Stream& stream);

 private:
  template <class Call>
  void per_block(void* data, std::span<const size_t> offsets, Dtype type, const char* what,
                 Call call);
  int rank_ = 0, world_ = 1;
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace anvil::device
