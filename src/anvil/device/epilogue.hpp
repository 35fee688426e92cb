// The GEMM epilogues the trainer uses (bias, GELU), as per-element bodies:
// the CPU GEMM engine applies them with a loop, cuBLASLt fuses its own, and
// the GPU tests compare the two through these.
#pragma once

#include <cmath>
#include <string>

#include "anvil/device/gpu_compat.hpp"

namespace anvil::device {

enum class Epilogue { none, bias, gelu, bias_gelu };

std::string to_string(Epilogue e);

// GELU, tanh approximation (GPT-2's "gelu_new", cuBLASLt's GELU epilogue):
// 0.5 x (1 + tanh(kGeluBeta (x + kGeluKappa x^3))). The layers' GELU
// (kernels/bodies.hpp) uses the same constants with a vectorisable tanh.
inline constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluKappa = 0.044715f;
ANVIL_HD inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluBeta * (x + kGeluKappa * x * x * x)));
}

// One output element after the epilogue: `acc` is alpha * sum + beta * c,
// `bias` the output column's bias (ignored without one).
ANVIL_HD inline float apply_epilogue(Epilogue e, float acc, float bias) {
  switch (e) {
    case Epilogue::none:
      return acc;
    case Epilogue::bias:
      return acc + bias;
    case Epilogue::gelu:
      return gelu_tanh(acc);
    case Epilogue::bias_gelu:
      return gelu_tanh(acc + bias);
  }
  return acc;
}

}  // namespace anvil::device
