#include "anvil/optim/adamw.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/optim/square_sum.hpp"

namespace anvil::optim {

namespace {

// The parts of the parameters AdamW updates inside `owned`, in arena order,
// their moments packed back to back.
std::vector<AdamW::Range> all_of(const model::ParamRegistry& registry,
                                 std::vector<AdamW::Range> owned) {
  return owned.empty() ? std::vector<AdamW::Range>{{0, registry.total()}} : owned;
}

}  // namespace

AdamW::AdamW(const model::ParamRegistry& registry, AdamWConfig config, bool skip_muon_group,
             std::vector<Range> owned)
    : registry_(registry),
      config_(config),
      owned_(all_of(registry, std::move(owned))),
      sharded_(owned_.size() != 1 || owned_[0] != Range{0, registry.total()}),
      pieces_([&] {
        std::vector<Piece> pieces;
        int64_t local = 0;
        for (const auto& [begin, end] : owned_) {
          for (const auto& s : registry.specs()) {
            if (skip_muon_group && s.group == model::OptimizerGroup::muon) continue;
            const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
            if (lo >= hi) continue;
            pieces.push_back({&s, lo, hi, local});
            local += hi - lo;
          }
        }
        return pieces;
      }()),
      m_("adamw.exp_avg",
         static_cast<size_t>(pieces_.empty() ? 0
                                             : pieces_.back().local + pieces_.back().end -
                                                   pieces_.back().begin) *
             sizeof(float)),
      v_("adamw.exp_avg_sq", m_.capacity()) {
  // Blocks of 16 KiB of weights: each is converted to the bf16 copy (when
  // there is one) right after its update, while it is still in cache.
  constexpr int64_t kBlock = 4096;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const int64_t n = pieces_[i].end - pieces_[i].begin;
    for (int64_t b = 0; b < n; b += kBlock) blocks_.push_back({i, b, std::min(kBlock, n - b)});
  }
}

kernels::body::AdamWStep AdamW::constants(const Piece& piece, float lr, int64_t step) const {
  const float b1 = config_.beta1, b2 = config_.beta2;
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(b2, static_cast<float>(step)));
  const model::ParamSpec& s = *piece.spec;
  const float plr = lr * s.lr_scale;
  return {b1,        b2,       config_.eps,
          plr / bc1, bc2_sqrt, s.weight_decay ? 1.0f - plr * config_.weight_decay : 1.0f};
}

void AdamW::update(float* params, const float* grads, float lr, int64_t step, float grad_scale,
                   bf16* params_bf16) {
  float* m = exp_avg();
  float* v = exp_avg_sq();
  std::vector<kernels::body::AdamWStep> steps;
  steps.reserve(pieces_.size());
  for (const Piece& piece : pieces_) steps.push_back(constants(piece, lr, step));
  // One parallel region over every piece's blocks: a norm's weights or a
  // bias do not cost a region each with one thread at work.
  const auto blocks = static_cast<int64_t>(blocks_.size());
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const Block& block = blocks_[static_cast<size_t>(b)];
    const Piece& piece = pieces_[block.piece];
    const kernels::body::AdamWStep& st = steps[block.piece];
    const int64_t i0 = piece.begin + block.offset, n = block.size;
    float* p = params + i0;
    const float* g = grads + i0;
    float* ms = m + piece.local + block.offset;
    float* vs = v + piece.local + block.offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      kernels::body::adamw(p + i, ms + i, vs + i, g[i] * grad_scale, st);
    if (params_bf16 != nullptr) to_bf16(params_bf16 + i0, p, n);
  }
}

std::vector<model::TensorShard> AdamW::state(const std::vector<Range>& within) {
  std::vector<model::TensorShard> out;
  const std::vector<Range> all = {{0, registry_.total()}};
  const std::vector<Range>& limit = within.empty() ? all : within;
  for (const char* which : {".exp_avg", ".exp_avg_sq"}) {
    float* base = reinterpret_cast<float*>((which[8] == '\0' ? m_ : v_).base());
    for (const Piece& piece : pieces_) {
      for (const auto& [wb, we] : limit) {
        const int64_t lo = std::max(piece.begin, wb), hi = std::min(piece.end, we);
        if (lo >= hi) continue;
        const model::ParamSpec& s = *piece.spec;
        out.push_back({s.name + which, s.shape, lo - s.offset, hi - lo, 0,
                       sharded_ ? model::Sharding::zero_range : s.sharding,
                       base + piece.local + (lo - piece.begin)});
      }
    }
  }
  return out;
}

double sum_of_squares(const float* grads, int64_t n, std::optional<int>* scale_hint) {
  if (scale_hint && *scale_hint) {  // the largest magnitude and the sum at the guess together
    const MaxAndSquareSum guessed = max_and_square_sum(grads, n, **scale_hint);
    const float m = guessed.max;
    if (!(m > 0)) return std::isnan(m) ? static_cast<double>(m) : 0.0;
    const int scale = square_scale(m);
    *scale_hint = scale;
    if (const SquareSum* sum = guessed.at(scale)) return square_sum_value(*sum, scale);
    return square_sum_value(scaled_square_sum(grads, n, scale), scale);
  }
  const float m = max_abs(grads, n);
  if (!(m > 0)) return std::isnan(m) ? static_cast<double>(m) : 0.0;  // NaN or Inf, or all zero
  const int scale = square_scale(m);
  if (scale_hint) *scale_hint = scale;
  return square_sum_value(scaled_square_sum(grads, n, scale), scale);
}

double global_norm(const float* grads, int64_t n, std::optional<int>* scale_hint) {
  return std::sqrt(sum_of_squares(grads, n, scale_hint));
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

double Schedule::at(int64_t step) const {
  step -= start;
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / warmup;
  const double min_lr = lr * min_lr_ratio;
  if (kind == "constant") return lr;
  if (kind == "wsd") {
    const auto decay_steps = static_cast<int64_t>(std::ceil(decay_fraction * total));
    const int64_t decay_start = total - decay_steps;
    if (step < decay_start || decay_steps == 0) return lr;
    const double frac = static_cast<double>(step - decay_start + 1) / decay_steps;
    return lr + (min_lr - lr) * std::min(1.0, frac);
  }
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double frac = std::min(1.0, static_cast<double>(step - warmup) / span);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * frac));
}

void validate(const Schedule& s, const std::string& flag) {
  if (s.kind != "cosine" && s.kind != "wsd" && s.kind != "constant") {
    throw InputError(flag + ": expected cosine, wsd or constant, got '" + s.kind + "'");
  }
  if (!(s.lr > 0)) throw InputError("--lr: expected a number > 0");
  if (s.min_lr_ratio < 0 || s.min_lr_ratio > 1) {
    throw InputError("--min-lr-ratio: expected a number in [0, 1]");
  }
  if (s.decay_fraction < 0 || s.decay_fraction > 1) {
    throw InputError("--decay-fraction: expected a number in [0, 1]");
  }
}

}  // namespace anvil::optim
