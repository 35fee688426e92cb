// The tensors the model config in a checkpoint's state.json implies,
// against its index: every parameter and extra model state present with
// its shape, nothing else of kind "model", and each optimizer tensor named
// after one of them (NAME.exp_avg, NAME.momentum_buffer, ...) with that
// tensor's shape. A checkpoint failing this is intact on disk but loads
// into no model of its own config. Passed as verify_checkpoint's
// TensorCheck by the code that reads checkpoints into models (the sharded
// format itself knows no model: ckpt/sharded.hpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::ckpt {

// At most 8 problems, then a count; none for a state without a config
// (tools' fixtures). A config implying far more tensors than the index
// holds is one problem, without building its registry.
std::vector<std::string> model_tensor_problems(const std::string& dir, const nlohmann::json& state,
                                               const nlohmann::json& index);

}  // namespace anvil::ckpt
