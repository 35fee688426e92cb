#include "anvil/optim/muon.hpp"

#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <type_traits>
#include <utility>

#include "anvil/base/threads.hpp"
#include "anvil/device/blas.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/bodies.hpp"

namespace anvil::optim {
namespace {

constexpr float kA = kNewtonSchulzA, kB = kNewtonSchulzB, kC = kNewtonSchulzC;

}  // namespace

namespace {

// out [cols, rows] = scale * in^T for in [rows, cols] (leading dimensions
// ldo and ldi), a 16 x 16 tile at a time through a small buffer: each tile's
// lines are read and written whole, once, so strides of a power-of-two
// length (512, 1024 floats, one cache set for every row) cost no conflict
// misses (an element-wise strided copy took ~1/8 of a zaya-small Muon step;
// 64 x 64 tiles ran 5x slower at 512). `out` and `in` must not overlap.
void transpose_scaled(float* out, int64_t ldo, const float* in, int64_t ldi, int64_t rows,
                      int64_t cols, float scale) {
  constexpr int64_t kTile = 16;
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    alignas(64) float tile[kTile * kTile];
    const int64_t ni = std::min(kTile, rows - i0);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t nj = std::min(kTile, cols - j0);
      for (int64_t i = 0; i < ni; ++i) {
        const float* row = in + (i0 + i) * ldi + j0;
        for (int64_t j = 0; j < nj; ++j) tile[j * kTile + i] = row[j] * scale;
      }
      for (int64_t j = 0; j < nj; ++j) {
        std::memcpy(out + (j0 + j) * ldo + i0, tile + j * kTile,
                    static_cast<size_t>(ni) * sizeof(float));
      }
    }
  }
}

// x = g / |g|_F in the wide orientation (r <= c); returns whether transposed.
bool ns_start(float* x, const float* g, int64_t rows, int64_t cols) {
  const bool transposed = rows > cols;
  const int64_t n = rows * cols;
  double norm2 = 0;
#pragma omp simd reduction(+ : norm2)
  for (int64_t i = 0; i < n; ++i) norm2 += static_cast<double>(g[i]) * g[i];
  const float inv = kernels::body::muon_unit_factor(std::sqrt(norm2));
  if (transposed) {
    transpose_scaled(x, rows, g, cols, rows, cols, inv);
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] = g[i] * inv;
  }
  return transposed;
}

void ns_finish(float* out, const float* x, int64_t rows, int64_t cols, bool transposed) {
  if (transposed) {
    transpose_scaled(out, cols, x, rows, cols, rows, 1.0f);  // x is [cols, rows]
  } else {
    std::memcpy(out, x, static_cast<size_t>(rows * cols) * sizeof(float));
  }
}

// copy = in, rounded = in to bf16, in one pass over `in`.
void copy_and_round(float* copy, bf16* rounded, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    copy[i] = in[i];
    rounded[i] = to_bf16(in[i]);
  }
}

// From the lower triangle of S [r, r] (the diagonal and below; the upper
// triangle is not read): rounded = bf16(S) and, with kCopy, copy = S, both
// whole, the upper triangle mirrored from the lower. One pass, 16 x 16 tiles
// (see transpose_scaled), for the Gram matrices of the bf16 iteration.
template <bool kCopy>
void round_symmetric(bf16* rounded, float* copy, const float* s, int64_t r) {
  constexpr int64_t kTile = 16;
  // n elements of a row: rounded (and copied) from src to (i, j).
  auto put_row = [&](int64_t i, int64_t j, const float* src, int64_t n) {
    bf16* out = rounded + i * r + j;
    for (int64_t k = 0; k < n; ++k) out[k] = to_bf16(src[k]);
    if constexpr (kCopy) std::memcpy(copy + i * r + j, src, static_cast<size_t>(n) * sizeof(float));
  };
#pragma omp parallel for schedule(static, 1) if (!omp_in_parallel())
  for (int64_t i0 = 0; i0 < r; i0 += kTile) {
    alignas(64) float tile[kTile * kTile];
    const int64_t ni = std::min(kTile, r - i0);
    for (int64_t i = 0; i < ni; ++i) {  // the diagonal tile, the upper half from the lower
      for (int64_t j = 0; j < ni; ++j)
        tile[j] = j <= i ? s[(i0 + i) * r + i0 + j] : s[(i0 + j) * r + i0 + i];
      put_row(i0 + i, i0, tile, ni);
    }
    for (int64_t j0 = 0; j0 < i0; j0 += kTile) {  // whole tiles left of it, then their mirror
      for (int64_t i = 0; i < ni; ++i) {
        const float* row = s + (i0 + i) * r + j0;
        put_row(i0 + i, j0, row, kTile);
        for (int64_t j = 0; j < kTile; ++j) tile[j * kTile + i] = row[j];
      }
      for (int64_t j = 0; j < kTile; ++j) put_row(j0 + j, i0, tile + j * kTile, ni);
    }
  }
}

// The lower triangle of out = alpha X X^T + beta out (and some of the upper).
template <typename T>
void gram_lower(const T* x, int64_t r, int64_t c, float alpha, float beta, float* out,
                device::GemmBackend backend) {
  // fp32 on OpenBLAS: its syrk (the triangle alone, ~0.6 of the GEMM's time
  // at 512 x 1024, against ~0.75 for 4 strips).
  if constexpr (std::is_same_v<T, float>) {
    if ((backend == device::GemmBackend::automatic || backend == device::GemmBackend::openblas) &&
        device::blas_ssyrk_lower(r, c, alpha, x, c, beta, out, r))
      return;
  }
  const int64_t strips = gram_strip_count(r);
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t lo = r * s / strips, hi = r * (s + 1) / strips;
    // Rows lo..hi against rows 0..hi: the strip's blocks left of and on the diagonal.
    device::gemm(false, true, hi - lo, hi, c, alpha, x + lo * c, c, x, c, beta, out + lo * r, r,
                 backend);
  }
}

template <typename T>
void gram_mirrored(const T* x, int64_t r, int64_t c, float alpha, float beta, float* out,
                   device::GemmBackend backend) {
  gram_lower(x, r, c, alpha, beta, out, backend);
  // The upper triangle from the lower, a band of 16 rows at a time: the
  // diagonal tile element by element, the rest transposed from the column
  // band below it.
  constexpr int64_t kBand = 16;
  for (int64_t i0 = 0; i0 < r; i0 += kBand) {
    const int64_t ie = std::min(r, i0 + kBand);
    for (int64_t i = i0; i < ie; ++i)
      for (int64_t j = i + 1; j < ie; ++j) out[i * r + j] = out[j * r + i];
    if (ie < r) transpose_scaled(out + i0 * r + ie, r, out + ie * r + i0, r, r - ie, ie - i0, 1.0f);
  }
}

}  // namespace

void symmetric_gram(const float* x, int64_t r, int64_t c, float alpha, float beta, float* out,
                    device::GemmBackend backend) {
  gram_mirrored(x, r, c, alpha, beta, out, backend);
}

void symmetric_gram(const bf16* x, int64_t r, int64_t c, float alpha, float beta, float* out,
                    device::GemmBackend backend) {
  gram_mirrored(x, r, c, alpha, beta, out, backend);
}

void newton_schulz(float* out, const float* g, int64_t rows, int64_t cols, int steps, float* x,
                   float* y, float* a, float* b, device::GemmBackend backend) {
  // Work on the wide orientation (r <= c) so the Gram matrices are r x r.
  const bool transposed = ns_start(x, g, rows, cols);
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  for (int s = 0; s < steps; ++s) {
    symmetric_gram(x, r, c, 1.0f, 0.0f, a, backend);  // A = X X^T
    std::memcpy(b, a, static_cast<size_t>(r * r) * sizeof(float));
    symmetric_gram(a, r, r, kC, kB, b, backend);  // B = b A + c A A (A A = A A^T)
    std::memcpy(y, x, static_cast<size_t>(r * c) * sizeof(float));
    device::gemm(false, false, r, c, r, 1.0f, b, r, x, c, kA, y, c, backend);  // Y = a X + B X
    std::swap(x, y);
  }
  ns_finish(out, x, rows, cols, transposed);
}

void newton_schulz_bf16(float* out, const float* g, int64_t rows, int64_t cols, int steps, float* x,
                        float* y, float* a, float* b, bf16* xb, bf16* ab,
                        device::GemmBackend backend) {
  const bool transposed = ns_start(x, g, rows, cols);
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  for (int s = 0; s < steps; ++s) {
    copy_and_round(y, xb, x, r * c);               // y = X (Y's a X term), xb = bf16(X)
    gram_lower(xb, r, c, 1.0f, 0.0f, a, backend);  // A = X X^T (its lower triangle)
    round_symmetric<true>(ab, b, a, r);
    gram_lower(ab, r, r, kC, kB, b, backend);  // B = b A + c A A (A A = A A^T)
    round_symmetric<false>(ab, nullptr, b, r);
    device::gemm(false, false, r, c, r, 1.0f, ab, r, xb, c, kA, y, c, backend);  // Y = a X + B X
    std::swap(x, y);
  }
  ns_finish(out, x, rows, cols, transposed);
}

namespace {

size_t largest_matrix(const model::ParamRegistry& registry) {
  int64_t most = 0;
  for (const auto& s : registry.specs()) {
    if (s.group == model::OptimizerGroup::muon) most = std::max(most, s.numel);
  }
  return static_cast<size_t>(most);
}

size_t largest_gram(const model::ParamRegistry& registry) {
  int64_t most = 0;
  for (const auto& s : registry.specs()) {
    if (s.group != model::OptimizerGroup::muon) continue;
    const int64_t r = std::min(s.shape[0], s.numel / s.shape[0]);
    most = std::max(most, r * r);
  }
  return static_cast<size_t>(most);
}

}  // namespace

namespace {

// Momentum offsets per registry entry (the last element: the total): the
// matrices this rank owns, packed in registry order.
std::vector<int64_t> owned_offsets(const model::ParamRegistry& registry,
                                   const std::vector<int>& owners, int rank) {
  const auto& specs = registry.specs();
  std::vector<int64_t> local(specs.size() + 1, 0);
  int64_t next = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    local[i] = next;
    if (owners[i] == rank) next += specs[i].numel;
  }
  local[specs.size()] = next;
  return local;
}

// Per registry entry: whether its matrix is orthogonalised in a batch — a
// muon-group matrix whose shape (rows, cols) at least one other muon-group
// matrix shares (ZAYA1's experts). Decided from the registry alone, so a
// matrix takes the same path, and gets the same bits, on any rank layout.
std::vector<char> batched_entries(const model::ParamRegistry& registry) {
  const auto& specs = registry.specs();
  std::map<std::pair<int64_t, int64_t>, int> count;
  auto shape = [&](size_t i) {
    return std::make_pair(specs[i].shape[0], specs[i].numel / specs[i].shape[0]);
  };
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].group == model::OptimizerGroup::muon) ++count[shape(i)];
  std::vector<char> out(specs.size(), 0);
  for (size_t i = 0; i < specs.size(); ++i)
    out[i] = specs[i].group == model::OptimizerGroup::muon && count[shape(i)] > 1;
  return out;
}

}  // namespace

std::vector<int> muon_owners(const model::ParamRegistry& registry, int world, int ep, int rank) {
  const auto& specs = registry.specs();
  std::vector<int> owners(specs.size(), -1);
  auto cost = [&](size_t i) {
    const double rows = static_cast<double>(specs[i].shape[0]);
    const double cols = static_cast<double>(specs[i].numel) / rows;
    return rows * cols * std::min(rows, cols);
  };
  std::vector<double> load(static_cast<size_t>(std::max(1, world)), 0.0);
  // Largest first, each to the least-loaded of ranks first, first + step, ...
  // (ties: the lower rank).
  auto assign = [&](const std::function<bool(const model::ParamSpec&)>& pick, int first, int step) {
    std::vector<size_t> order;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].group == model::OptimizerGroup::muon && pick(specs[i])) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost(a) > cost(b); });
    for (size_t i : order) {
      int least = first;
      for (int r = first; r < static_cast<int>(load.size()); r += step)
        if (load[static_cast<size_t>(r)] < load[static_cast<size_t>(least)]) least = r;
      owners[i] = least;
      load[static_cast<size_t>(least)] += cost(i);
    }
  };
  if (ep <= 1) {
    assign([](const model::ParamSpec&) { return true; }, 0, 1);
  } else {
    // The replicated matrices first, over every rank (the same on all), then
    // this rank's experts over the ranks holding them: rank % ep alike.
    assign([](const model::ParamSpec& s) { return s.sharding != model::Sharding::expert; }, 0, 1);
    assign([](const model::ParamSpec& s) { return s.sharding == model::Sharding::expert; },
           rank % ep, ep);
  }
  return owners;
}

Muon::Muon(const model::ParamRegistry& registry, MuonConfig config, int rank, int world, int ep)
    : registry_(registry),
      config_(config),
      rank_(rank),
      owners_(muon_owners(registry, world, ep, rank)),
      batched_(batched_entries(registry)),
      sharded_(world > 1),
      local_(owned_offsets(registry, owners_, rank)),
      momentum_("muon.momentum_buffer", static_cast<size_t>(local_.back()) * sizeof(float)),
      // One scratch set per thread when there are batched matrices (each
      // thread orthogonalises one matrix at a time), else one.
      sets_(std::find(batched_.begin(), batched_.end(), 1) != batched_.end()
                ? std::max(1, omp_get_max_threads())
                : 1),
      scratch_("muon scratch",
               static_cast<size_t>(sets_) *
                   (tensor::Arena::rounded(largest_matrix(registry) * 4) * 3 +
                    tensor::Arena::rounded(largest_gram(registry) * 4) * 2 +
                    (config.ns_bf16 ? tensor::Arena::rounded(largest_matrix(registry) * 2) +
                                          tensor::Arena::rounded(largest_gram(registry) * 2)
                                    : 0))) {
  const auto matrix = static_cast<int64_t>(largest_matrix(registry));
  const auto gram = static_cast<int64_t>(largest_gram(registry));
  for (int t = 0; t < sets_; ++t) {
    Scratch w;
    w.x = scratch_.take_floats(matrix);
    w.y = scratch_.take_floats(matrix);
    w.u = scratch_.take_floats(matrix);
    w.a = scratch_.take_floats(gram);
    w.b = scratch_.take_floats(gram);
    if (config.ns_bf16) {
      w.xb = static_cast<bf16*>(scratch_.take_bytes(static_cast<size_t>(matrix) * sizeof(bf16)));
      w.ab = static_cast<bf16*>(scratch_.take_bytes(static_cast<size_t>(gram) * sizeof(bf16)));
    }
    work_.push_back(w);
  }
}

void Muon::update_one(size_t i, float* params, const float* grads, float lr, float grad_scale,
                      const Scratch& w, device::GemmBackend backend) {
  const auto& s = registry_.specs()[i];
  const float mu = config_.momentum;
  const int64_t rows = s.shape[0], cols = s.numel / rows;
  float* p = params + s.offset;
  const float* g = grads + s.offset;
  float* buf = momentum() + local_[i];
  float* update = w.u;
  // Inside the batch's parallel region these loops run on the calling thread.
#pragma omp parallel for simd schedule(static) if (!omp_in_parallel())
  for (int64_t j = 0; j < s.numel; ++j)
    update[j] = kernels::body::muon_momentum(buf + j, g[j] * grad_scale, mu, config_.nesterov);
  // In place is fine: newton_schulz reads its input before writing its output.
  if (config_.ns_bf16) {
    newton_schulz_bf16(update, update, rows, cols, config_.ns_steps, w.x, w.y, w.a, w.b, w.xb, w.ab,
                       backend);
  } else {
    newton_schulz(update, update, rows, cols, config_.ns_steps, w.x, w.y, w.a, w.b, backend);
  }
  const float scale = 0.2f * std::sqrt(static_cast<float>(std::max(rows, cols)));
  const float plr = lr * s.lr_scale;
  const float decay = s.weight_decay ? 1.0f - plr * config_.weight_decay : 1.0f;
#pragma omp parallel for simd schedule(static) if (!omp_in_parallel())
  for (int64_t j = 0; j < s.numel; ++j)
    kernels::body::muon_apply(p + j, update[j], decay, plr * scale);
}

void Muon::update(float* params, const float* grads, float lr, float grad_scale) {
  const auto& specs = registry_.specs();
  std::vector<size_t> batch;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (owners_[i] != rank_) continue;  // outside the group, or another rank's
    if (batched_[i]) {
      batch.push_back(i);
    } else {  // a matrix of its own shape: its GEMMs use every thread
      update_one(i, params, grads, lr, grad_scale, work_[0], device::GemmBackend::automatic);
    }
  }
  // Same-shape matrices: one per thread at a time, each on single-threaded
  // GEMMs (small matrices keep a core busier alone than split over several),
  // in any order: each matrix's result depends on it alone. fp32 runs on
  // OpenBLAS; bf16 on oneDNN where native (a primitive made for the one
  // thread its caller allows), else widened for OpenBLAS.
  const auto n = static_cast<int64_t>(batch.size());
  const device::GemmBackend backend =
      config_.ns_bf16 && device::bf16_path() == device::Bf16Path::native
          ? device::GemmBackend::onednn
          : device::GemmBackend::openblas;
  for_each_single_threaded(n, sets_, [&](int64_t k, int thread) {
    update_one(batch[static_cast<size_t>(k)], params, grads, lr, grad_scale,
               work_[static_cast<size_t>(thread)], backend);
  });
}

std::vector<model::TensorShard> Muon::state() {
  std::vector<model::TensorShard> out;
  const auto& specs = registry_.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (owners_[i] != rank_) continue;
    out.push_back({specs[i].name + ".momentum_buffer", specs[i].shape, 0, specs[i].numel, 0,
                   sharded_ ? model::Sharding::zero_range : specs[i].sharding,
                   momentum() + local_[i]});
  }
  return out;
}

}  // namespace anvil::optim
