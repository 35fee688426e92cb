// Compiled against the model layer's include root by the layering tests: the
// layers below (kernels, device, tensor, base) are visible.
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/model/config.hpp"
