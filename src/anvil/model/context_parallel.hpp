// Context parallelism inside a model: a sequence of T tokens is cut into 2C
// chunks of S = T / 2C and rank r of the C-rank context group holds chunks
// r and 2C-1-r (head-tail: under the causal mask every rank then has the
// same number of query-key products). A rank's B rows are laid out [B][2][S]
// (its first chunk, then its second), and everything that acts per token —
// norms, projections, MLPs, experts, the classifier — runs on those rows
// unchanged. What couples tokens across chunks lives here:
//   - attention: K and V are all-gathered over the group into natural order
//     and each local query chunk attends the key prefix it may see
//     (kernels' AttentionView); backward gathers again, adds dK/dV over the
//     whole length and reduce-scatters them back to their owners;
//   - halos: rows just before a chunk (CCA's convolutions and value shift)
//     come from the rank holding the previous chunk; their gradients go back;
//   - positions: RoPE and learned position embeddings use global positions.
// With C = 1 (no group) the models take their ordinary paths. The group's
// communication is behind ContextGroup (parallel/context_group.hpp runs it
// over MPI), as expert parallelism's is behind TokenDispatcher.
// docs/context-parallel.md has the message sizes and what overlaps what.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "anvil/base/clock.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/model/carver.hpp"

namespace anvil::model {

// Where a rank's rows sit in the sequence.
struct ContextLayout {
  int size = 1;      // C: ranks in the context group
  int rank = 0;      // this rank's place in it
  int64_t seq = 0;   // T: the whole sequence
  int64_t chunk() const { return seq / (2 * size); }  // S
  int64_t local() const { return seq / size; }        // rows per sequence here (2S)
  // The global chunk index of local chunk p (0 or 1) of rank `r`.
  int64_t chunk_of(int r, int p) const { return p == 0 ? r : 2 * size - 1 - r; }
  int64_t chunk_index(int p) const { return chunk_of(rank, p); }
  // The rank holding global chunk k, and which of its two chunks it is.
  int owner(int64_t k) const { return static_cast<int>(k < size ? k : 2 * size - 1 - k); }
  int slot(int64_t k) const { return k < size ? 0 : 1; }
  // The global position of local chunk p's first row.
  int64_t start(int p) const { return chunk_index(p) * chunk(); }
  // This rank's rows of full [B][seq][width] into local [B][local()][width],
  // in its chunk order (the trainer's batches, tests).
  template <class E>
  void take_local(const E* full, E* local, int64_t B, int64_t width) const {
    const int64_t S = chunk();
    for (int64_t b = 0; b < B; ++b)
      for (int p = 0; p < 2; ++p)
        std::copy_n(full + (b * seq + start(p)) * width, S * width,
                    local + (b * this->local() + p * S) * width);
  }
};

// The context group's communication, float32, in place of MPI here.
class ContextGroup {
 public:
  virtual ~ContextGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // recv [size][count] = every rank's send [count], in rank order.
  virtual void allgather(const float* send, float* recv, size_t count) = 0;
  // recv [count] = the sum over ranks of their send [size][count]'s block `rank`.
  virtual void reduce_scatter(const float* send, float* recv, size_t count) = 0;
  // Point to point: posts every receive and send, then waits for all.
  struct Message {
    float* data;
    size_t count;
    int peer;
    int tag;
  };
  virtual void exchange(std::span<const Message> sends, std::span<const Message> recvs) = 0;
};

class ContextParallel {
 public:
  // `group` null: C = 1. B rows of T tokens (T divisible by 2C, S >= 2:
  // the trainer checks and names the option).
  ContextParallel(ContextGroup* group, int64_t B, int64_t T);
  bool split() const { return layout_.size > 1; }
  const ContextLayout& layout() const { return layout_; }
  int64_t batch() const { return B_; }
  int64_t local() const { return layout_.local(); }  // rows per sequence here
  int64_t chunk() const { return layout_.chunk(); }

  // The shared buffers for attention with `kv_width` = 2 Hkv D floats of K|V
  // per token (the largest over the model's layers), from the model's arena.
  void carve(Carver& c, int64_t kv_width);
  // Their bytes, for a memory plan made before any model (0 for C = 1).
  static size_t scratch_bytes(int64_t B, int64_t T, int size, int64_t kv_width);

  // Causal attention over this rank's rows when split (C = 1 takes the
  // packed kernels): qkv [B][local][q | k | v] (Hq, Hkv heads of D); out
  // [B][local][Hq D]; lse [2][B][Hq][S]; on `tiles` (kernels::attention_tiles_for).
  void attention_forward(float* out, float* lse, const float* qkv, int64_t Hq, int64_t Hkv,
                         int64_t D, kernels::AttentionTiles tiles);
  // Writes every entry of dqkv, as kernels::attention_backward does.
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int64_t Hq, int64_t Hkv, int64_t D,
                          kernels::AttentionTiles tiles);

  // Halos over local sequences (chunk p of row b is sequence 2b + p, rows
  // [(2b + p) S, (2b + p + 1) S) of `rows`, `stride` floats apart): heads
  // [2B][n][width] = the n rows before each chunk (zeros before chunk 0).
  void halo_forward(float* heads, const float* rows, int64_t stride, int64_t width, int64_t n);
  // Adds dheads (heads' gradient) to the gradient of the rows they came
  // from: d_rows (same layout as rows), on the rank that holds them.
  void halo_backward(float* d_rows, int64_t stride, const float* dheads, int64_t width, int64_t n);

  // Calls f(first_row, rows, first_position) for every chunk of every row
  // (RoPE, position embeddings): [B][2] chunks of S rows.
  template <class F>
  void for_each_chunk(F&& f) const {
    for (int64_t b = 0; b < B_; ++b)
      for (int p = 0; p < 2; ++p) f((2 * b + p) * chunk(), chunk(), layout_.start(p));
  }

  // Seconds spent communicating since the last call: in K/V gathers and
  // dK/dV reduce-scatters, and in halo exchanges.
  double take_kv_seconds() { return std::exchange(kv_seconds_, 0.0); }
  double take_halo_seconds() { return std::exchange(halo_seconds_, 0.0); }

 private:
  void gather_kv(const float* qkv, int64_t W, int64_t off, int64_t KVW);
  // [B][T][w] natural order <-> [C][B][local][w] the ranks' order.
  void reorder(float* natural, float* ranked, int64_t w, bool to_natural) const;
  ContextGroup* group_;
  ContextLayout layout_;
  int64_t B_;
  int64_t kv_width_ = 0;
  float *natural_ = nullptr, *ranked_ = nullptr, *local_ = nullptr, *dnatural_ = nullptr;
  std::vector<float> send_[2], recv_[2];  // halo messages (small: B x n x width)
  double kv_seconds_ = 0, halo_seconds_ = 0;
};

}  // namespace anvil::model
