// Writes a CCA layer's weights (ZAYA1 checkpoint names, layer 0), an input,
// anvil's output and every gradient for tests/python/cca_parity.py, which
// rebuilds the layer in PyTorch from the ZAYA1 spec, section 3.
// Usage: cca_parity_dump OUT_DIR
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "anvil/ckpt/safetensors.hpp"
#include "anvil/model/cca_layer.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cca_parity_dump OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  std::filesystem::create_directories(out);
  anvil::model::CcaShape s;
  s.hidden = 48;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.rotary_dim = 8;  // half the head, as ZAYA1's 64 of 128
  const int64_t B = 2, S = 70, N = B * S, H = s.hidden, C = s.channels(), d = s.head_dim;
  const int64_t Cq = s.q_latent();
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(gen);
    return v;
  };
  auto wqk = random(C * H), wv1 = random(d * H), wv2 = random(d * H), c0w = random(C * 2),
       c0b = random(C), c1w = random(C * d * 2), c1b = random(C), temp = random(2),
       wo = random(H * Cq), x = random(N * H), r = random(N * H);
  auto zeros = [](const std::vector<float>& v) { return std::vector<float>(v.size(), 0.0f); };
  auto g_wqk = zeros(wqk), g_wv1 = zeros(wv1), g_wv2 = zeros(wv2), g_c0w = zeros(c0w),
       g_c0b = zeros(c0b), g_c1w = zeros(c1w), g_c1b = zeros(c1b), g_temp = zeros(temp),
       g_wo = zeros(wo), dx = zeros(x);
  const anvil::model::CcaParams p{wqk.data(), wv1.data(), wv2.data(),  c0w.data(), c0b.data(),
                                  c1w.data(), c1b.data(), temp.data(), wo.data()};
  const anvil::model::CcaParams g{g_wqk.data(), g_wv1.data(),  g_wv2.data(),
                                  g_c0w.data(), g_c0b.data(),  g_c1w.data(),
                                  g_c1b.data(), g_temp.data(), g_wo.data()};
  anvil::model::CcaLayer layer(s, B, S);
  layer.allocate();
  std::vector<float> y(N * H);
  layer.forward(y.data(), x.data(), p);
  layer.backward(dx.data(), g, r.data(), x.data(), p);
  const std::string a = "model.layers.0.self_attn.";
  using T = anvil::ckpt::TensorRef;
  std::vector<T> tensors = {
      {a + "qkv.linear_q.weight", {Cq, H}, wqk.data()},
      {a + "qkv.linear_k.weight", {C - Cq, H}, wqk.data() + Cq * H},
      {a + "qkv.val_proj1.weight", {d, H}, wv1.data()},
      {a + "qkv.val_proj2.weight", {d, H}, wv2.data()},
      {a + "qkv.conv_qk.0.weight", {C, 1, 2}, c0w.data()},
      {a + "qkv.conv_qk.0.bias", {C}, c0b.data()},
      {a + "qkv.conv_qk.1.weight", {C, d, 2}, c1w.data()},
      {a + "qkv.conv_qk.1.bias", {C}, c1b.data()},
      {a + "qkv.temp", {2}, temp.data()},
      {a + "o_proj.weight", {H, Cq}, wo.data()},
      {"x", {B, S, H}, x.data()},
      {"r", {B, S, H}, r.data()},
      {"out", {B, S, H}, y.data()},
      {"grad.x", {B, S, H}, dx.data()},
      {"grad." + a + "qkv.linear_q.weight", {Cq, H}, g_wqk.data()},
      {"grad." + a + "qkv.linear_k.weight", {C - Cq, H}, g_wqk.data() + Cq * H},
      {"grad." + a + "qkv.val_proj1.weight", {d, H}, g_wv1.data()},
      {"grad." + a + "qkv.val_proj2.weight", {d, H}, g_wv2.data()},
      {"grad." + a + "qkv.conv_qk.0.weight", {C, 1, 2}, g_c0w.data()},
      {"grad." + a + "qkv.conv_qk.0.bias", {C}, g_c0b.data()},
      {"grad." + a + "qkv.conv_qk.1.weight", {C, d, 2}, g_c1w.data()},
      {"grad." + a + "qkv.conv_qk.1.bias", {C}, g_c1b.data()},
      {"grad." + a + "qkv.temp", {2}, g_temp.data()},
      {"grad." + a + "o_proj.weight", {H, Cq}, g_wo.data()},
  };
  anvil::ckpt::write_safetensors(out + "/cca.safetensors", tensors,
                                 {{"q_heads", "4"},
                                  {"kv_heads", "2"},
                                  {"head_dim", "16"},
                                  {"rotary_dim", "8"},
                                  {"rope_theta", "10000"}});
  return 0;
}
