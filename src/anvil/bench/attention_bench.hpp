// `anvil bench attention`: the trainer's causal attention kernels (forward,
// backward, both) by sequence length and head size, against the sgemm peak
// measured in the same run (a 2048^3 fp32 GEMM on the same threads). FLOPs
// are counted without the causal-masked half or the backward's recompute:
// forward 4 D T (T + 1) / 2 per (sequence, head), backward twice that.
// `--dtype bf16` times the tiles a bf16 run takes (kernels::attention_tiles_for)
// against the bf16 GEMM peak.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/table.hpp"
#include "anvil/bench/measure.hpp"

namespace anvil::bench {

struct AttentionBenchOptions {
  std::vector<int64_t> seqs = {256, 512, 1024, 2048};
  std::vector<int64_t> head_dims = {64, 128};
  int64_t heads = 8;         // query heads
  int64_t kv_heads = 0;      // 0: = heads (no grouping)
  int64_t tokens = 4096;     // tokens per call (batch = tokens / seq, at least 1)
  int threads = 0;           // 0: all cores
  double min_seconds = 0.3;  // timed per case
  std::string dtype = "fp32";  // fp32, or bf16: the bf16 runs' tiles (AVX512_BF16)
  bool progress = false;
};

struct AttentionRow {
  int64_t seq = 0, head_dim = 0, batch = 0, heads = 0, kv_heads = 0;
  double fwd_gflops = 0, bwd_gflops = 0, total_gflops = 0;  // from median times
  double pct_of_peak = 0;  // forward + backward over the sgemm peak
};

struct AttentionBenchResult {
  int threads = 1;
  std::string dtype = "fp32";
  double sgemm_peak_gflops = 0;  // 2048^3 GEMM of the dtype (fp32: sgemm), median, same threads
  std::vector<AttentionRow> rows;
  nlohmann::json to_json() const;
  Table to_table() const;
};

// The rows alone (no sgemm peak; pct_of_peak left 0): what `anvil hw
// --profile` records for the planner.
std::vector<AttentionRow> time_attention(const AttentionBenchOptions& options);

AttentionBenchResult run_attention_bench(const AttentionBenchOptions& options);

}  // namespace anvil::bench
