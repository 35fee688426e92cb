// Writes a ZAYA1 MoE layer's weights (ZAYA1 checkpoint names, layer 3: a MoE
// layer with an EDA scale), inputs, anvil's outputs, expert choices and every
// gradient for tests/python/moe_parity.py (a PyTorch reference from
// the ZAYA1 spec, section 4). Balancing biases favour the skip class so
// some tokens skip. With AUX and Z, the router's load-balancing loss and
// z-loss are on (those coefficients) and their gradients are part of every
// gradient dumped. Usage: moe_parity_dump [TOP_K (default 1) [AUX Z]] OUT_DIR
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "anvil/ckpt/safetensors.hpp"
#include "anvil/model/zaya_moe_layer.hpp"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3 && argc != 5) {
    std::fprintf(stderr, "usage: moe_parity_dump [TOP_K [AUX Z]] OUT_DIR\n");
    return 2;
  }
  anvil::model::RouterLossCoefs losses;
  if (argc == 5) {
    losses.aux = std::stof(argv[2]);
    losses.z = std::stof(argv[3]);
  }
  const std::string out = argv[argc - 1];
  std::filesystem::create_directories(out);
  anvil::model::ZayaMoeShape s;
  s.hidden = 24;
  s.router_dim = 16;
  s.experts = 4;
  s.expert_ffn = 12;
  s.top_k = argc >= 3 ? std::stoi(argv[1]) : 1;
  const int64_t k = s.top_k;
  const int64_t N = 60, H = s.hidden, R = s.router_dim, E = s.experts, K = E + 1, F = s.expert_ffn;
  std::mt19937 gen(21);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(gen);
    return v;
  };
  std::vector<std::vector<float>> w = {
      random(R * H),    random(R),     random(R), random(R),     random(R * R),
      random(R),        random(R * R), random(R), random(K * R), random(E * 2 * F * H),
      random(E * H * F)};
  std::vector<std::vector<float>> gw;
  for (const auto& v : w) gw.emplace_back(v.size(), 0.0f);
  auto params = [](std::vector<std::vector<float>>& v) {
    return anvil::model::ZayaMoeParams{
        {v[0].data(), v[1].data(), v[2].data(), v[3].data(), v[4].data(), v[5].data(), v[6].data(),
         v[7].data(), v[8].data()},
        {v[9].data(), v[10].data()}};
  };
  const std::vector<float> bias = {0.25f, 0.2f, 0.12f, -0.3f,
                                   0.02f};  // the last is skip; every class gets tokens
  auto x = random(N * H), rprev = random(N * R), r = random(N * H), r2 = random(N * R);
  std::vector<float> y(N * H), rstate(N * R), dx(N * H), drprev(N * R);
  anvil::model::ZayaMoeLayer layer(s, N, losses);
  layer.forward(y.data(), rstate.data(), x.data(), rprev.data(), params(w), bias.data());
  layer.backward(dx.data(), drprev.data(), params(gw), r.data(), r2.data(), x.data(), rprev.data(),
                 params(w));
  std::vector<float> choices(N * k);
  for (int64_t a = 0; a < N * k; ++a) choices[a] = static_cast<float>(layer.choices()[a]);
  const std::string a = "model.layers.3.zaya_block.";
  const char* names[] = {
      "router.down_proj.weight",    "router.down_proj.bias",      "router.router_states_scale",
      "router.rmsnorm_eda.weight",  "router.router_mlp.0.weight", "router.router_mlp.0.bias",
      "router.router_mlp.2.weight", "router.router_mlp.2.bias",   "router.router_mlp.4.weight"};
  const std::vector<std::vector<int64_t>> shapes = {{R, H}, {R},    {R}, {R},   {R, R},
                                                    {R},    {R, R}, {R}, {K, R}};
  std::vector<anvil::ckpt::TensorRef> t;
  for (size_t i = 0; i < 9; ++i) {
    t.push_back({a + names[i], shapes[i], w[i].data()});
    t.push_back({"grad." + a + names[i], shapes[i], gw[i].data()});
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string ex = a + "experts.local_experts." + std::to_string(e) + ".";
    t.push_back({ex + "linear_fc1.weight", {2 * F, H}, w[9].data() + e * 2 * F * H});
    t.push_back({ex + "linear_fc2.weight", {H, F}, w[10].data() + e * H * F});
    t.push_back({"grad." + ex + "linear_fc1.weight", {2 * F, H}, gw[9].data() + e * 2 * F * H});
    t.push_back({"grad." + ex + "linear_fc2.weight", {H, F}, gw[10].data() + e * H * F});
  }
  t.push_back({a + "router.balancing_biases", {K}, bias.data()});
  t.push_back({"x", {N, H}, x.data()});
  t.push_back({"rstate_prev", {N, R}, rprev.data()});
  t.push_back({"r", {N, H}, r.data()});
  t.push_back({"r2", {N, R}, r2.data()});
  t.push_back({"out", {N, H}, y.data()});
  t.push_back({"rstate", {N, R}, rstate.data()});
  t.push_back({"choices", {N, k}, choices.data()});
  t.push_back({"grad.x", {N, H}, dx.data()});
  t.push_back({"grad.rstate_prev", {N, R}, drprev.data()});
  const float aux_loss = static_cast<float>(layer.stats().aux_loss);
  const float z_loss = static_cast<float>(layer.stats().z_loss);
  t.push_back({"aux_loss", {1}, &aux_loss});
  t.push_back({"z_loss", {1}, &z_loss});
  anvil::ckpt::write_safetensors(out + "/moe.safetensors", t,
                                 {{"experts", std::to_string(E)},
                                  {"expert_ffn", std::to_string(F)},
                                  {"top_k", std::to_string(k)},
                                  {"aux_coef", argc == 5 ? argv[2] : "0"},
                                  {"z_coef", argc == 5 ? argv[3] : "0"}});
  return 0;
}
