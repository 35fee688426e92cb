#include "anvil/model/params.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "anvil/base/error.hpp"
#include "anvil/base/rng.hpp"
#include "anvil/tensor/tensor.hpp"

// glibc's vector math library (libmvec, which -lm brings in) has SIMD
// versions of cos and log; glibc's math.h declares them only under
// -ffast-math. Declared here, for this file alone, so the Box-Muller loop
// below is vectorised (~13x faster on AVX-512, ~6x on AVX2; a one-step
// gpt2-124m run on 2 Zen 5 cores, 4.9 -> 3.8 s, medians of 3 interleaved)
// while every other loop keeps the scalar libm.
// Their double results round to the same floats (no difference in 16.7M
// draws of the AVX-512, AVX2 and SSE variants against the scalar libm).
// (Inside the linkage block: clang takes the pragma only on a function's
// own declaration.)
extern "C" {
#pragma omp declare simd notinbranch
double cos(double);
#pragma omp declare simd notinbranch
double log(double);
}

namespace anvil::model {

const ParamSpec& ParamRegistry::add(std::string name, std::vector<int64_t> shape, Init init,
                                    float init_std, bool weight_decay, OptimizerGroup group) {
  if (!index_.emplace(name, specs_.size()).second)
    throw InputError("parameter " + name + " registered twice");
  ParamSpec spec;
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  spec.init = init;
  spec.init_std = init_std;
  spec.weight_decay = weight_decay;
  spec.group = group;
  spec.offset = total_;
  spec.numel = tensor::numel(spec.shape);
  const std::string layers = "model.layers.";
  if (spec.name.rfind(layers, 0) == 0) spec.layer = std::atoll(spec.name.c_str() + layers.size());
  total_ += spec.numel;
  specs_.push_back(std::move(spec));
  return specs_.back();
}

int64_t ParamRegistry::layer_begin(int64_t layer) const {
  int64_t begin = total_;
  for (const auto& s : specs_) {
    if (s.layer == layer) begin = std::min(begin, s.offset);
  }
  return begin;
}

const ParamSpec* ParamRegistry::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

void ParamRegistry::scale_lr(const std::string& part, float scale) {
  for (auto& s : specs_) {
    if (s.name.find(part) != std::string::npos) s.lr_scale = scale;
  }
}

void ParamRegistry::set_sharding(const std::string& part, Sharding sharding) {
  for (auto& s : specs_) {
    if (s.name.find(part) != std::string::npos) s.sharding = sharding;
  }
}

std::vector<TensorShard> ParamRegistry::shards(
    float* arena, const std::vector<std::pair<int64_t, int64_t>>& ranges,
    const std::string& suffix, const std::function<bool(const ParamSpec&)>& keep) const {
  std::vector<TensorShard> out;
  for (const auto& [begin, end] : ranges) {
    for (const auto& s : specs_) {
      if (keep && !keep(s)) continue;
      const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
      if (lo >= hi) continue;
      out.push_back({s.name + suffix, s.shape, lo - s.offset, hi - lo, 0, s.sharding, arena + lo});
    }
  }
  return out;
}

const ParamSpec& ParamRegistry::get(const std::string& name) const {
  const ParamSpec* s = find(name);
  if (s == nullptr) throw InputError("no parameter named " + name);
  return *s;
}

namespace {

// Normal tensors are filled in chunks of kInitChunk elements at multiples
// of it, whatever the thread count: which elements a vector call computes
// (and which a chunk's scalar remainder) depends on the tensor alone.
constexpr int64_t kInitChunk = 256;

// n <= kInitChunk values of `std` x N(0, 1) for elements [first, first + n)
// of a stream: the uniforms drawn first, then Box-Muller's log and cos over
// the chunk in one vectorised loop.
void fill_normal(float* p, int64_t first, int64_t n, double std, uint64_t seed, uint64_t stream) {
  double u1[kInitChunk], u2[kInitChunk];
  for (int64_t i = 0; i < n; ++i) {
    u1[i] = random_unit(seed, stream, 2 * (first + i));
    u2[i] = random_unit(seed, stream, 2 * (first + i) + 1);
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(std * box_muller(u1[i], u2[i]));
}

}  // namespace

void ParamRegistry::initialize(float* params, uint64_t seed) const {
  for (const auto& s : specs_) {
    float* p = params + s.offset;
    if (s.init != Init::normal) {
      std::fill(p, p + s.numel,
                s.init == Init::ones       ? 1.0f
                : s.init == Init::constant ? s.init_std
                                           : 0.0f);
      continue;
    }
    const uint64_t stream = stream_id(s.name);
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < s.numel; i0 += kInitChunk)
      fill_normal(p + i0, i0, std::min(kInitChunk, s.numel - i0), s.init_std, seed, stream);
  }
}

std::string layer_param_name(int64_t layer, const std::string& rest) {
  return "model.layers." + std::to_string(layer) + "." + rest;
}

std::string to_string(Sharding sharding) {
  switch (sharding) {
    case Sharding::replicated:
      return "replicated";
    case Sharding::zero_range:
      return "zero-range";
    case Sharding::expert:
      return "expert";
  }
  return "?";
}

std::string to_string(OptimizerGroup group) {
  return group == OptimizerGroup::muon ? "muon" : "adamw";
}

}  // namespace anvil::model
