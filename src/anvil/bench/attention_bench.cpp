#include "anvil/bench/attention_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "anvil/base/error.hpp"
#include "anvil/base/threads.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::bench {
namespace {

std::vector<float> filled(size_t n, uint32_t mult) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * mult) % 1000) * 1e-3f - 0.5f;
  return v;
}

}  // namespace

std::vector<AttentionRow> time_attention(const AttentionBenchOptions& o) {
  const int64_t Hkv = o.kv_heads > 0 ? o.kv_heads : o.heads;
  if (o.heads < 1 || o.heads % Hkv != 0)
    throw InputError("--kv-heads: expected a divisor of --heads (" + std::to_string(o.heads) +
                     "), got " + std::to_string(Hkv));
  for (int64_t T : o.seqs)
    if (T < 1) throw InputError("--seqs: expected lengths >= 1, got " + std::to_string(T));
  for (int64_t D : o.head_dims)
    if (D < 1) throw InputError("--head-dims: expected sizes >= 1, got " + std::to_string(D));
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw InputError("--dtype: expected fp32 or bf16, got '" + o.dtype + "'");
  if (o.threads > 0) set_num_threads(o.threads);
  TimingPolicy policy;
  policy.min_seconds = o.min_seconds;
  std::vector<AttentionRow> rows;
  const size_t total = o.head_dims.size() * o.seqs.size();
  size_t done = 0;
  for (int64_t D : o.head_dims) {
    const kernels::AttentionTiles tiles = o.dtype == "bf16" ? kernels::attention_tiles_for(true, D)
                                                            : kernels::AttentionTiles::automatic;
    if (o.dtype == "bf16" && tiles != kernels::AttentionTiles::bf16)
      throw InputError(
          "--dtype bf16: the bf16 tiles need AVX512_BF16, the tile kernel and a head "
          "size of 16k (got --head-dims " +
          std::to_string(D) + ")");
    for (int64_t T : o.seqs) {
      const int64_t B = std::max<int64_t>(1, o.tokens / T), H = o.heads;
      const int64_t Q = (H + 2 * Hkv) * D;
      const auto qkv = filled(static_cast<size_t>(B * T * Q), 2654435761u);
      const auto dout = filled(static_cast<size_t>(B * T * H * D), 40503u);
      std::vector<float> att(static_cast<size_t>(B * T * H * D)),
          lse(static_cast<size_t>(B * H * T)), dqkv(qkv.size());
      progress_line(o.progress, done++, total,
                    "attention T=" + std::to_string(T) + " D=" + std::to_string(D));
      const Samples fwd = time_calls(
          [&] {
            kernels::attention_forward(att.data(), lse.data(), qkv.data(), B, T, H, Hkv, D, tiles);
          },
          policy);
      const Samples bwd = time_calls(
          [&] {
            kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(),
                                        lse.data(), B, T, H, Hkv, D, tiles);
          },
          policy);
      const double f = 4.0 * static_cast<double>(D) * static_cast<double>(T) *
                       (static_cast<double>(T) + 1) / 2 * static_cast<double>(B * H);
      AttentionRow r;
      r.seq = T;
      r.head_dim = D;
      r.batch = B;
      r.heads = H;
      r.kv_heads = Hkv;
      r.fwd_gflops = f / fwd.median() / 1e9;
      r.bwd_gflops = 2 * f / bwd.median() / 1e9;
      r.total_gflops = 3 * f / (fwd.median() + bwd.median()) / 1e9;
      rows.push_back(r);
    }
  }
  progress_line(o.progress, total, total, "");
  return rows;
}

AttentionBenchResult run_attention_bench(const AttentionBenchOptions& o) {
  AttentionBenchResult result;
  result.rows = time_attention(o);  // checks the options and sets the threads first
  result.threads = num_threads();
  TimingPolicy policy;
  policy.min_seconds = o.min_seconds;
  result.dtype = o.dtype;
  {
    const int64_t n = 2048;
    const auto a = filled(n * n, 2654435761u), b = filled(n * n, 40503u);
    std::vector<bf16> a16(o.dtype == "bf16" ? n * n : 0), b16(a16.size());
    for (size_t i = 0; i < a16.size(); ++i) {
      a16[i] = to_bf16(a[i]);
      b16[i] = to_bf16(b[i]);
    }
    std::vector<float> c(n * n);
    const Samples s = time_calls(
        [&] {
          if (o.dtype == "bf16") {
            device::gemm(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(),
                         n);
          } else {
            device::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
          }
        },
        policy);
    result.sgemm_peak_gflops = 2.0 * n * n * n / s.median() / 1e9;
  }
  for (auto& r : result.rows) r.pct_of_peak = 100.0 * r.total_gflops / result.sgemm_peak_gflops;
  return result;
}

nlohmann::json AttentionBenchResult::to_json() const {
  nlohmann::json j = {{"benchmark", "attention"},
                      {"dtype", dtype},
                      {"threads", threads},
                      {"sgemm_peak_gflops", sgemm_peak_gflops},
                      {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    j["rows"].push_back({{"seq", r.seq},
                         {"head_dim", r.head_dim},
                         {"batch", r.batch},
                         {"heads", r.heads},
                         {"kv_heads", r.kv_heads},
                         {"fwd_gflops", r.fwd_gflops},
                         {"bwd_gflops", r.bwd_gflops},
                         {"total_gflops", r.total_gflops},
                         {"pct_of_sgemm_peak", r.pct_of_peak}});
  }
  return j;
}

Table AttentionBenchResult::to_table() const {
  Table t({"T", "head dim", "B x H (kv)", "fwd GFLOP/s", "bwd GFLOP/s", "fwd+bwd GFLOP/s",
           dtype == "bf16" ? "% of bf16 GEMM peak" : "% of sgemm peak"});
  for (const auto& r : rows) {
    t.add_row({std::to_string(r.seq), std::to_string(r.head_dim),
               std::to_string(r.batch) + " x " + std::to_string(r.heads) + " (" +
                   std::to_string(r.kv_heads) + ")",
               fmt(r.fwd_gflops, 1), fmt(r.bwd_gflops, 1), fmt(r.total_gflops, 1),
               fmt(r.pct_of_peak, 1)});
  }
  return t;
}

}  // namespace anvil::bench
