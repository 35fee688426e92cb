// A hardware profile: what one device (a GPU, or this CPU) can do, as the
// planner needs it. Published profiles ship in profiles/ with a source for
// every figure; `anvil hw --profile out.json` measures this machine's.
// The JSON format is documented in docs/hw-profile.md; version 1.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::plan {

// Peak dense GEMM throughput for one dtype (and, on a CPU, one thread count).
struct PeakCompute {
  std::string dtype;  // f64 | f32 | tf32 | bf16 | f16 | fp8 | int8
  int threads = 0;    // 0: the whole device
  double gflops = 0;
  bool operator==(const PeakCompute&) const = default;
};

// Achieved bandwidth for a working-set size (caches to DRAM).
struct MemoryLevel {
  std::string level;  // L1 | L2 | L3 | DRAM | HBM
  int64_t working_set_bytes = 0;
  int threads = 0;
  double gbs = 0;
  bool operator==(const MemoryLevel&) const = default;
};

struct EfficiencyPoint {
  double flops = 0;       // work of one GEMM
  double efficiency = 0;  // fraction of peak
  bool operator==(const EfficiencyPoint&) const = default;
};

// One measured GEMM shape (anvil bench gemm --profile): the planner prices
// a GEMM of exactly this shape, dtype and transposition at this rate.
struct GemmShapePoint {
  std::string dtype;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int threads = 0;
  double gflops = 0;  // median call
  bool operator==(const GemmShapePoint&) const = default;
};

// Measured causal attention (forward + backward, the trainer's kernel): the
// rate it reaches at a sequence length and head size.
struct AttentionPoint {
  std::string dtype;  // the kernel's arithmetic (f32 on CPUs)
  int64_t seq = 0;
  int64_t head_dim = 0;
  double gflops = 0;  // training FLOPs (3 x 4 x head_dim x T(T+1)/2 per head) per second
  bool operator==(const AttentionPoint&) const = default;
};

struct Interconnect {
  int devices_per_node = 1;
  std::string intra_node_link;  // "Infinity Fabric", "NVLink 4", "shared memory"
  // Per device, one direction, summed over its links (NVLink 4: 450 GB/s;
  // datasheets quote both directions, 900). JSON key intra_node_gbs_per_direction;
  // a profile with only the older key intra_node_gbs (both directions) is read
  // as half of it.
  double intra_node_gbs = 0;
  int nics_per_node = 0;
  double nic_gbps = 0;   // per NIC, gigabits per second
  std::string topology;  // "rails-only", "fat-tree", "single node"
  bool operator==(const Interconnect&) const = default;
};

// What a device achieves of its datasheet figures, as public microbenchmarks
// measured it. The same rule for every vendor: the planner prices memory,
// GEMMs and links at datasheet x achievable; 0 means "not published", and the
// planner's default applies (kDefaultAchievable* in perf_model.hpp). A
// measured profile needs none: its rates are achieved ones already.
struct Achievable {
  double memory = 0;                   // HBM/DRAM bandwidth
  std::map<std::string, double> gemm;  // best large GEMM / peak, per dtype
  double link = 0;                     // intra-node collective bus bandwidth / link
  bool operator==(const Achievable&) const = default;
};

struct Source {
  std::string field;   // JSON path, e.g. "peak[bf16]"
  std::string value;   // the figure as published
  std::string source;  // where it was published
  bool operator==(const Source&) const = default;
};

struct HwProfile {
  int version = 1;
  std::string name;     // short id: mi300x, h100-sxm, h200-sxm, local
  std::string device;   // full name
  std::string kind;     // gpu | cpu
  std::string origin;   // published | measured
  std::string created;  // ISO-8601 date
  int64_t compute_units = 0;
  std::string compute_unit_name;  // CU | SM | core
  double clock_ghz = 0;
  int64_t memory_bytes = 0;
  double memory_bandwidth_gbs = 0;  // peak (published) or best measured DRAM (measured)
  std::vector<PeakCompute> peak;
  std::map<std::string, double> work_for_90pct_flops;                   // per dtype
  std::map<std::string, std::vector<EfficiencyPoint>> gemm_efficiency;  // per dtype
  std::vector<MemoryLevel> memory_levels;
  std::vector<AttentionPoint> attention;    // measured profiles only
  std::vector<GemmShapePoint> gemm_shapes;  // measured profiles only: exact shapes
  // A sweep of shapes (anvil bench gemm --preset grid): the efficiency
  // surface the planner interpolates for every shape not in gemm_shapes.
  std::vector<GemmShapePoint> gemm_grid;
  Achievable achievable;
  Interconnect interconnect;
  nlohmann::json comm = nlohmann::json::object();  // alpha-beta fits of the collectives
  std::vector<Source> sources;
  bool operator==(const HwProfile&) const = default;

  // Peak for a dtype: the largest entry (any thread count). 0 if absent.
  double peak_gflops(const std::string& dtype) const;
};

nlohmann::json to_json(const HwProfile& profile);
// Throws InputError naming `origin` and the field on malformed input.
HwProfile hw_profile_from_json(const nlohmann::json& j, const std::string& origin);
HwProfile load_hw_profile(const std::string& path);
void save_hw_profile(const HwProfile& profile, const std::string& path);  // atomic

// `name_or_path`: a profile JSON file, or the name of one shipped in
// profiles/ (searched in $ANVIL_PROFILES, next to the executable's parent
// directory, then ./profiles). Unknown names are an InputError naming `flag`
// and the names that exist.
HwProfile find_hw_profile(const std::string& name_or_path, const std::string& flag);
std::vector<std::string> shipped_profile_names();

}  // namespace anvil::plan
