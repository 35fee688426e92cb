// The shape of a ZAYA1 MoE layer and its parameters as pointers into the
// parameter (or gradient) arena, split the way the layer's pieces use them:
// the router's and the experts'. Shared by the router, the token
// dispatchers, the experts and the layer that strings them together.
#pragma once

#include <cstdint>

namespace anvil::model {

struct ZayaMoeShape {
  int64_t hidden = 2048;      // H
  int64_t router_dim = 256;   // R
  int64_t experts = 16;       // E (the skip class is E)
  int64_t expert_ffn = 2048;  // F: fc1 is [2F, H], fc2 [H, F]
  int64_t top_k = 1;          // classes (experts or skip) per token
  float norm_eps = 1e-5f;
  bool skip_identity = true;  // skip output gate * x (the original) or 0 (later ports)
};

// PyTorch layouts.
struct ZayaRouterParams {
  float* down_w;     // [R, H]
  float* down_b;     // [R]
  float* eda_scale;  // [R] router_states_scale; null in the first MoE layer
  float* norm_w;     // [R] rmsnorm_eda
  float* mlp0_w;     // [R, R]
  float* mlp0_b;     // [R]
  float* mlp2_w;     // [R, R]
  float* mlp2_b;     // [R]
  float* mlp4_w;     // [E + 1, R]
};

struct ZayaExpertParams {
  float* fc1;  // [E, 2F, H] (expert e at e * 2F * H); under --ep the rank's E/K
  float* fc2;  // [E, H, F]
};

struct ZayaMoeParams {
  ZayaRouterParams router;
  ZayaExpertParams experts;
};

}  // namespace anvil::model
