// How a model's matrix multiplies run (the option model.dtype): fp32
// throughout, or bf16 inputs with fp32 accumulation (fp32 master weights, fp32 gradients;
// a bf16 copy of the weights is refreshed whenever params() was handed out).
// The decoder presets and ZAYA1 share it.
#pragma once

#include <string>

namespace anvil::model {

enum class Precision { fp32, bf16 };
std::string to_string(Precision precision);

}  // namespace anvil::model
