// The kernels' exp, tanh, sigmoid, normal CDF and row maximum: device/fast_math.hpp's
// (the GEMM epilogues share them), named in this namespace.
#pragma once

#include "anvil/device/fast_math.hpp"

namespace anvil::kernels {

using device::fast_exp;
using device::fast_normal_cdf;
using device::fast_sigmoid;
using device::fast_tanh;
#if !ANVIL_DEVICE_CODE
using device::max_of;
#endif

}  // namespace anvil::kernels
