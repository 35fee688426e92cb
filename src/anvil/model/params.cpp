#include "anvil/model/params.hpp"

#include <algorithm>
#include <cstdlib>

#include "anvil/base/error.hpp"
#include "anvil/base/rng.hpp"
#include "anvil/tensor/tensor.hpp"

namespace anvil::model {

const ParamSpec& ParamRegistry::add(std::string name, std::vector<int64_t> shape, Init init,
                                    float init_std, bool weight_decay, OptimizerGroup group) {
  if (find(name) != nullptr) throw InputError("parameter " + name + " registered twice");
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
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
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

void ParamRegistry::initialize(float* params, uint64_t seed) const {
  for (const auto& s : specs_) {
    float* p = params + s.offset;
    const uint64_t stream = stream_id(s.name);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.numel; ++i) {
      switch (s.init) {
        case Init::zeros:
          p[i] = 0.0f;
          break;
        case Init::ones:
          p[i] = 1.0f;
          break;
        case Init::normal:
          p[i] = static_cast<float>(s.init_std * random_normal(seed, stream, i));
          break;
      }
    }
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
