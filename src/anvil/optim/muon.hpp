// Muon for the 2-D weight matrices of the blocks (the registry's muon group):
// heavy-ball momentum (Nesterov by default), the update orthogonalised by 5
// Newton–Schulz iterations (quintic, coefficients 3.4445, -4.7750, 2.0315),
// scaled by 0.2 * sqrt(max(rows, cols)) so its RMS matches AdamW's and one
// learning rate serves both, and decoupled weight decay. AdamW updates the
// rest (see AdamW's `skip_muon_group`). The GEMMs of the iteration run on the
// GEMM backend in fp32, or with bf16 inputs and fp32 accumulation
// (`ns_bf16`: as the reference Muon runs its iteration in bf16; ~2x faster
// here on AVX512_BF16 through oneDNN).
//
// Matrices that share their shape with another muon-group matrix (ZAYA1's
// experts) are orthogonalised in a batch: one matrix per thread at a time,
// each on single-threaded GEMMs; a matrix of its own shape runs its GEMMs on
// every thread. Which matrices batch depends on the registry alone, so a
// matrix gets the same bits on any number of ranks. With ns_bf16 a batched
// matrix runs its bf16 GEMMs single-threaded too: oneDNN's AVX512_BF16
// kernels on the native path, widened to fp32 for OpenBLAS on the emulated.
// X X^T and A A (A symmetric) are multiplied below the diagonal only
// (symmetric_gram), ~1/3 fewer FLOPs per iteration for a square matrix.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/model/params.hpp"
#include "anvil/tensor/arena.hpp"

namespace anvil::optim {

// The quintic Newton-Schulz iteration X <- a X + (b A + c A A) X, A = X X^T
// (host and device Muon alike).
inline constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f,
                       kNewtonSchulzC = 2.0315f;

struct MuonConfig {
  float momentum = 0.95f;
  bool nesterov = true;
  int ns_steps = 5;
  float weight_decay = 0.1f;  // the trainer's --weight-decay, AdamW's too
  bool ns_bf16 = false;       // Newton-Schulz GEMMs with bf16 inputs
};

// Which of `world` data-parallel ranks orthogonalises each muon-group
// matrix (by registry index; -1 outside the group): largest Newton-Schulz
// cost (rows x cols x min(rows, cols)) first, each to the least-loaded rank,
// ties to the lower rank — deterministic, the same on every rank. Under
// expert parallelism (ep > 1) the replicated matrices are placed first, the
// same on every rank, then `rank`'s registry's expert matrices (its share
// of the experts) over the ranks holding them (rank % ep alike).
std::vector<int> muon_owners(const model::ParamRegistry& registry, int world, int ep = 1,
                             int rank = 0);

class Muon {
 public:
  // rank/world: distributed Muon — this rank updates only the matrices
  // muon_owners gives it (the trainer then broadcasts them from their owners).
  Muon(const model::ParamRegistry& registry, MuonConfig config, int rank = 0, int world = 1,
       int ep = 1);
  // Updates every muon-group parameter this rank owns; gradients are scaled
  // by grad_scale as read.
  void update(float* params, const float* grads, float lr, float grad_scale = 1.0f);
  // Owner rank of each registry entry (-1 outside the muon group).
  const std::vector<int>& owners() const { return owners_; }
  // Momentum buffers of the matrices this rank owns, back to back: entry i's
  // at momentum_offset(i), momentum_count() floats in all.
  float* momentum() { return reinterpret_cast<float*>(momentum_.base()); }
  int64_t momentum_offset(size_t i) const { return local_[i]; }
  int64_t momentum_count() const { return local_.back(); }
  const MuonConfig& config() const { return config_; }
  const model::ParamRegistry& registry() const { return registry_; }
  int rank() const { return rank_; }
  size_t state_bytes() const { return momentum_.capacity() + scratch_.capacity(); }
  // Per registry entry: orthogonalised in a same-shape batch.
  const std::vector<char>& batched() const { return batched_; }
  bool sharded() const { return sharded_; }
  // The state it keeps, by name: <param>.momentum_buffer of each matrix this
  // rank updates (distributed: zero-range shards, whole matrices).
  std::vector<model::TensorShard> state();

 private:
  // One thread's Newton-Schulz scratch.
  struct Scratch {
    float *x, *y, *u, *a, *b;
    bf16 *xb = nullptr, *ab = nullptr;
  };
  // Momentum, Newton-Schulz and the weight update of registry entry i.
  void update_one(size_t i, float* params, const float* grads, float lr, float grad_scale,
                  const Scratch& w, device::GemmBackend backend);

  const model::ParamRegistry& registry_;
  MuonConfig config_;
  int rank_;
  std::vector<int> owners_;
  std::vector<char> batched_;
  bool sharded_;
  std::vector<int64_t> local_;  // per registry entry: its momentum's offset (owned ones)
  tensor::Arena momentum_;
  int sets_;  // scratch sets: the threads when some matrices batch, else 1
  tensor::Arena scratch_;
  std::vector<Scratch> work_;
};

// out [r, r] = alpha X X^T + beta out for X [r, c] (row-major, leading
// dimension c), exactly symmetric. Only the lower triangle is multiplied and
// the upper one is mirrored from it: fp32 on OpenBLAS (automatic or openblas
// backend) through its ssyrk; otherwise horizontal strips of X against the
// rows up to each strip's end, the blocks on and below the diagonal, (k + 1)
// / 2k of the FLOPs with k strips of at least kGramStripRows rows. beta
// scales the lower triangle of the old `out`, so an `out` that is symmetric
// on entry (or a multiple of one) gives the same sum as a full GEMM would.
inline constexpr int64_t kGramStripRows = 128;
inline constexpr int64_t kGramMaxStrips = 4;  // past it the strips' GEMMs get too thin to gain
constexpr int64_t gram_strip_count(int64_t r) {
  return std::clamp<int64_t>(r / kGramStripRows, 1, kGramMaxStrips);
}
// The share of a full r x r x c GEMM's FLOPs that symmetric_gram's strips
// multiply (ssyrk: about (r + 1) / 2r).
constexpr double gram_flop_share(int64_t r) {
  const auto k = static_cast<double>(gram_strip_count(r));
  return (k + 1) / (2 * k);
}
void symmetric_gram(const float* x, int64_t r, int64_t c, float alpha, float beta, float* out,
                    device::GemmBackend backend = device::GemmBackend::automatic);
void symmetric_gram(const bf16* x, int64_t r, int64_t c, float alpha, float beta, float* out,
                    device::GemmBackend backend = device::GemmBackend::automatic);

// out [rows, cols] = the Newton–Schulz approximation of U V^T for
// G = U S V^T (G [rows, cols], row-major), with `steps` iterations. Scratch:
// x and y of rows*cols floats, a and b of min(rows, cols)^2. `out` may be
// `g` (the input is read before the output is written) but not x or y.
void newton_schulz(float* out, const float* g, int64_t rows, int64_t cols, int steps, float* x,
                   float* y, float* a, float* b,
                   device::GemmBackend backend = device::GemmBackend::automatic);
// The same with each GEMM's inputs rounded to bf16 (fp32 accumulation and
// fp32 iterate); extra scratch xb of rows*cols and ab of min(rows, cols)^2.
void newton_schulz_bf16(float* out, const float* g, int64_t rows, int64_t cols, int steps, float* x,
                        float* y, float* a, float* b, bf16* xb, bf16* ab,
                        device::GemmBackend backend = device::GemmBackend::automatic);

}  // namespace anvil::optim
