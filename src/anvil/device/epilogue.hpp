// The GEMM epilogues the trainer uses (bias, GELU, and GELU with its input
// kept for backward and its slope applied in backward), as per-element
// bodies: the CPU GEMM engine applies them with a loop, cuBLASLt fuses its
// own (or, where it has no fused kernel for a shape, runs these in one kernel
// after the GEMM), and the GPU tests compare the two through these.
#pragma once

#include <string>

#include "anvil/device/fast_math.hpp"
#include "anvil/device/gpu_compat.hpp"

namespace anvil::device {

// bias_gelu_aux and dgelu take an aux matrix with the output's shape, type and
// row stride:
//   bias_gelu_aux  out = gelu(acc + bias), aux = acc + bias (the MLP's forward,
//                  keeping the GELU's input for backward)
//   dgelu          out = acc * gelu'(aux) (backward through that GELU: acc is
//                  the gradient of its output, aux the forward's input)
enum class Epilogue { none, bias, gelu, bias_gelu, bias_gelu_aux, dgelu };

std::string to_string(Epilogue e);

// GELU, tanh approximation (GPT-2's "gelu_new", cuBLASLt's GELU epilogue):
// 0.5 x (1 + tanh(kGeluBeta (x + kGeluKappa x^3))), on fast_math.hpp's tanh,
// as the layers' GELU (kernels/bodies.hpp) is: the CPU engine's epilogue and
// the layers compute the same floats.
inline constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluKappa = 0.044715f;
ANVIL_HD inline float gelu_tanh(float x) {
  const float u = kGeluBeta * (x + kGeluKappa * x * x * x);
  return 0.5f * x * (1.0f + fast_tanh(u));
}

// d gelu_tanh(x) / dx.
ANVIL_HD inline float gelu_tanh_slope(float x) {
  const float u = kGeluBeta * (x + kGeluKappa * x * x * x);
  const float t = fast_tanh(u);
  const float du = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

inline bool has_bias(Epilogue e) {
  return e == Epilogue::bias || e == Epilogue::bias_gelu || e == Epilogue::bias_gelu_aux;
}
inline bool uses_aux(Epilogue e) {
  return e == Epilogue::bias_gelu_aux || e == Epilogue::dgelu;
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
    case Epilogue::bias_gelu_aux:  // the aux is written by the overload below
      return gelu_tanh(acc + bias);
    case Epilogue::dgelu:
      return acc;
  }
  return acc;
}

// The same with the element's aux: bias_gelu_aux writes it, dgelu reads it.
ANVIL_HD inline float apply_epilogue(Epilogue e, float acc, float bias, float& aux) {
  if (e == Epilogue::bias_gelu_aux) {
    aux = acc + bias;
    return gelu_tanh(aux);
  }
  if (e == Epilogue::dgelu) return acc * gelu_tanh_slope(aux);
  return apply_epilogue(e, acc, bias);
}

}  // namespace anvil::device
