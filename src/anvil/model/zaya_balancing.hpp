// ZAYA1 expert-bias balancing (docs/zaya1-spec.md section 4): after each
// step, each MoE layer's loads over the global batch move the selection
// biases of its experts (and, with a target, of the skip class). The biases
// steer top-k selection only; they get no gradient. docs/zaya1.md
// ("Balancing") has the measurements behind the defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/base/options.hpp"

namespace anvil::model {

// "pid" feeds the load error of each expert (its share of the routed tokens
// minus 1/E) as the gradient of a small Adam on the biases; "sign" moves each
// bias by lr * sign(1/E - load); "none". The skip class's bias stays at its
// init unless a target skip rate is set.
struct Balancing {
  std::string mode = "pid";
  float lr = 1e-2f;  // Adam lr (pid) or step (sign): the fastest a bias moves per step
  // Optional router losses added to the training loss (0 = off): the Switch
  // load-balancing loss and the router z-loss (kernels/zaya.hpp).
  float aux_loss_coef = 0.0f;
  float z_loss_coef = 0.0f;
  // pid's Adam. beta1 averages the error: an error that keeps its sign moves
  // the bias by about lr per step, one that flips every step (two experts
  // sharing a cluster of tokens) by a small fraction of it, so the biases
  // settle instead of flipping the cluster back and forth. beta2 is the
  // memory of the squared error that normalises the step: short, so the
  // large errors of the first steps do not slow the biases for long.
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  // Target share of the skip class (of all assignments); its bias is then
  // controlled like the experts' with error skip_rate - target. < 0: the
  // skip bias stays at its init.
  float skip_target = -1.0f;

  template <class V>
  void describe(V& v) {
    v({.name = "mode",
       .help = "ZAYA1 expert-bias balancing after each step: pid (Adam on the biases with the "
               "load error as gradient), sign (sign updates), none",
       .flag = "balancing"},
      mode, one_of({"pid", "sign", "none"}));
    v({.name = "lr", .help = "Rate of the expert-bias balancing", .flag = "balance-lr"}, lr,
      at_least(0.0f));
    v({.name = "beta1", .help = "pid balancing: Adam beta1 on the load error (its running mean)",
       .flag = "balance-beta1"},
      beta1, in_range(0.0f, 0.9999f));
    v({.name = "beta2",
       .help = "pid balancing: Adam beta2 (memory of the squared error that normalises steps)",
       .flag = "balance-beta2"},
      beta2, in_range(0.0f, 0.9999f));
    v({.name = "eps",
       .help = "pid balancing: Adam epsilon (load errors well below it move the biases in "
               "proportion to the error, larger ones by about --balance-lr)",
       .flag = "balance-eps"},
      eps, at_least(0.0f));
    v({.name = "skip_target",
       .help = "ZAYA1: target share of tokens routed to the skip class; its bias is then "
               "balanced like the experts' (-1: the skip bias stays at its init)"},
      skip_target, [](const float& x) {
        return x == -1.0f || (x >= 0 && x <= 1) ? "" : std::string("must be in [0, 1] (or -1)");
      });
    v({.name = "aux_loss_coef",
       .help = "ZAYA1 router: coefficient of the Switch load-balancing loss (0: off)"},
      aux_loss_coef, at_least(0.0f));
    v({.name = "z_loss_coef", .help = "ZAYA1 router: coefficient of the router z-loss (0: off)"},
      z_loss_coef, at_least(0.0f));
  }
};

// The biases of `layers` MoE layers over E experts + the skip class, and the
// controller's state. Init as the original: 0 for experts, -1 for skip.
class BiasBalancer {
 public:
  BiasBalancer(Balancing balancing, int64_t layers, int64_t experts);
  // One controller step of `layer` from its tokens per class over the step
  // ([E + 1], skip last); step counts from 1 (Adam's bias correction).
  void update(int64_t layer, const std::vector<int64_t>& load, int64_t step);
  const Balancing& settings() const { return b_; }
  // [layers][E + 1]; mutable for tests and checkpoints.
  std::vector<std::vector<float>>& biases() { return biases_; }
  const std::vector<std::vector<float>>& biases() const { return biases_; }
  float* biases(int64_t layer) { return biases_[static_cast<size_t>(layer)].data(); }
  // Adam's first and second moments, same shape (checkpointed).
  std::vector<std::vector<float>>& first_moments() { return m_; }
  std::vector<std::vector<float>>& second_moments() { return v_; }

 private:
  void control(int64_t layer, int64_t cls, float error, int64_t step);
  Balancing b_;
  int64_t experts_;
  std::vector<std::vector<float>> biases_, m_, v_;
};

}  // namespace anvil::model
