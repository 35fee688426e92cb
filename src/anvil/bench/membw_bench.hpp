// `anvil bench membw`: STREAM-style memory bandwidth (copy, scale, add, triad)
// plus read-only and write-only kernels over working sets from L1 to DRAM and
// 1..N threads. Bytes are counted as STREAM counts them (no write-allocate
// traffic): copy/scale 16 B per element, add/triad 24, read 8, write 8.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/table.hpp"
#include "anvil/bench/measure.hpp"
#include "anvil/device/runtime.hpp"

namespace anvil::bench {

struct MembwOptions {
  std::vector<std::string> kernels = {"copy", "scale", "add", "triad", "read", "write"};
  std::vector<int64_t> sizes;  // working-set bytes; empty: 16 KiB .. 1 GiB by 4x
  std::vector<int> threads;    // empty: 1..all cores
  double min_seconds = 0.1;    // timed per (kernel, size, threads)
  bool progress = false;
  device::DeviceKind device = device::DeviceKind::cpu;  // cuda: gpu_bench.hpp
};

struct MembwRow {
  std::string kernel;
  int64_t bytes = 0;  // working set asked for: all arrays of the kernel together
  int threads = 1;
  double gbs = 0;          // best pass, as STREAM reports
  double gbs_median = 0;   // median pass
  double pct_of_best = 0;  // of the best GB/s of this kernel over all sizes and threads
  double pct_of_datasheet = std::numeric_limits<double>::quiet_NaN();  // GPUs: of the published
};

struct MembwResult {
  std::vector<MembwRow> rows;
  nlohmann::json to_json() const;
  Table to_table() const;
};

// Arrays (of doubles) a kernel touches; throws InputError for an unknown name.
int arrays_of(const std::string& kernel);

MembwResult run_membw_bench(const MembwOptions& options);

// Each row's pct_of_best: of the best GB/s of its kernel among `rows`.
void set_pct_of_best(std::vector<MembwRow>& rows);

}  // namespace anvil::bench
