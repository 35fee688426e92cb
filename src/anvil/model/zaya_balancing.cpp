#include "anvil/model/zaya_balancing.hpp"

#include <cmath>

#include "anvil/base/error.hpp"

namespace anvil::model {

BiasBalancer::BiasBalancer(Balancing balancing, int64_t layers, int64_t experts)
    : b_(std::move(balancing)), experts_(experts) {
  if (b_.mode != "pid" && b_.mode != "sign" && b_.mode != "none") {
    throw InputError("--balancing: expected pid, sign or none, got '" + b_.mode + "'");
  }
  const size_t K = static_cast<size_t>(experts + 1);
  for (int64_t m = 0; m < layers; ++m) {
    std::vector<float> bias(K, 0.0f);
    bias.back() = -1.0f;  // the original's init: skip starts disfavoured
    biases_.push_back(bias);
    m_.emplace_back(K, 0.0f);
    v_.emplace_back(K, 0.0f);
  }
}

void BiasBalancer::control(int64_t layer, int64_t cls, float error, int64_t step) {
  const auto l = static_cast<size_t>(layer), e = static_cast<size_t>(cls);
  float& bias = biases_[l][e];
  if (b_.mode == "sign") {
    bias += error < 0 ? b_.lr : (error > 0 ? -b_.lr : 0.0f);
    return;
  }
  // Adam on the bias with the load error as its gradient.
  float& mo = m_[l][e];
  float& ve = v_[l][e];
  mo = b_.beta1 * mo + (1.0f - b_.beta1) * error;
  ve = b_.beta2 * ve + (1.0f - b_.beta2) * error * error;
  const float mh = mo / (1.0f - std::pow(b_.beta1, static_cast<float>(step)));
  const float vh = ve / (1.0f - std::pow(b_.beta2, static_cast<float>(step)));
  bias -= b_.lr * mh / (std::sqrt(vh) + b_.eps);
}

void BiasBalancer::update(int64_t layer, const std::vector<int64_t>& load, int64_t step) {
  if (b_.mode == "none") return;
  const int64_t E = experts_;
  int64_t routed = 0;
  for (int64_t e = 0; e < E; ++e) routed += load[static_cast<size_t>(e)];
  if (routed > 0) {
    for (int64_t e = 0; e < E; ++e) {
      control(layer, e,
              static_cast<float>(load[static_cast<size_t>(e)]) / static_cast<float>(routed) -
                  1.0f / static_cast<float>(E),
              step);
    }
  }
  // The skip class follows its target rate when one is set.
  const int64_t all = routed + load[static_cast<size_t>(E)];
  if (b_.skip_target >= 0.0f && all > 0) {
    control(
        layer, E,
        static_cast<float>(load[static_cast<size_t>(E)]) / static_cast<float>(all) - b_.skip_target,
        step);
  }
}

}  // namespace anvil::model
