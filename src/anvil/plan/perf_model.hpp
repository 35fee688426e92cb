// The performance model: prices the work of model_calc.hpp on a hardware
// profile. A GEMM costs its FLOPs at the dtype's peak times an efficiency =
// min(curve x tile x wave, roofline): the measured (or assumed) efficiency
// curve against per-GEMM work, tile quantization of the output, wave
// quantization of the tiles over the compute units, and the memory roofline.
// Collectives cost alpha + bytes / bandwidth, from the profile's measured
// fits or from its links (ring within a node, rails across nodes). A step is
// compute + exposed communication + optimizer. docs/plan.md has the formulas.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/plan/model_calc.hpp"

namespace anvil::plan {

// Derating (docs/plan.md): a published profile's datasheet figures are priced
// at datasheet x its `achievable` fractions (public microbenchmarks of that
// device); where it publishes none, these defaults apply, for every vendor
// alike. `anvil plan --assume` overrides either.
inline constexpr double kDefaultAchievableGemm = 0.70;    // best large GEMM / dense peak
inline constexpr double kDefaultAchievableMemory = 0.80;  // achieved / datasheet memory bandwidth
inline constexpr double kDefaultAchievableLink = 0.80;    // bus bandwidth / per-direction link
inline constexpr double kAssumedAttentionRelative = 0.6;  // flash attention / GEMM efficiency
inline constexpr double kIntraNodeAlphaUs = 5.0;          // per ring step inside a node
inline constexpr double kInterNodeAlphaUs = 10.0;         // per ring step across nodes

// The output tile one GEMM kernel computes per CU/SM (GPU profiles).
inline constexpr int64_t kGpuTileM = 256;
inline constexpr int64_t kGpuTileN = 128;
inline constexpr int64_t kMinSplitK = 256;  // smallest K chunk of a split-K GEMM

struct GemmPrice {
  double flops = 0;
  double seconds = 0;
  double efficiency = 0;         // of the dtype's peak
  double curve = 1;              // from per-GEMM work
  double tile = 1;               // useful / computed output elements
  double wave = 1;               // tiles / (waves x compute units)
  double roofline = 1;           // memory-bound fraction (1: compute bound)
  bool measured = false;         // priced from a measured shape
  bool surface = false;          // priced from the measured grid (gemm_grid)
  int64_t tiles = 0, waves = 0;  // output tiles; waves after any split-K
};
// The bytes Muon's Newton-Schulz (5 iterations) moves besides its GEMMs for
// one [r, c] matrix (r <= c), fp32 or with bf16 GEMM inputs.
double newton_schulz_bytes(int64_t r, int64_t c, bool bf16);

// A shape measured into the profile (anvil bench gemm --profile) is priced at
// its measured rate (`measured` set); others from the measured grid where the
// profile has one (`surface`), else by the model above.
GemmPrice price_gemm(const HwProfile& hw, const std::string& dtype, int64_t m, int64_t n, int64_t k,
                     bool trans_a = false, bool trans_b = false);

// Efficiency from the profile's curve at `work` FLOPs (log-linear between
// points, clamped at the ends); the achievable GEMM fraction without a curve.
double curve_efficiency(const HwProfile& hw, const std::string& dtype, double work);

// The measured efficiency surface (the profile's gemm_grid): GFLOP/s at
// (m, n, k), multilinear in log m, log n, log k between the grid's values
// (clamped at its ends), from the points of the same dtype and transposition
// (any transposition when it has none of those); 0 without grid points.
double grid_gflops(const HwProfile& hw, const std::string& dtype, int64_t m, int64_t n, int64_t k,
                   bool trans_a, bool trans_b);

// The fractions a profile is priced at (its own, else the defaults), and
// `anvil plan --assume KEY=VALUE` (memory, link, gemm or gemm.DTYPE; each a
// fraction in (0, 1]) written into a profile. InputError names the flag.
double achievable_memory(const HwProfile& hw);
double achievable_link(const HwProfile& hw);
double achievable_gemm(const HwProfile& hw, const std::string& dtype);
void apply_assumption(HwProfile& hw, const std::string& key_value);

// Sustained memory bandwidth (GB/s): a measured profile's largest measured
// working set at the most threads; a published one's datasheet x achievable.
double memory_gbs(const HwProfile& hw);

// One collective of `bytes` (nccl-tests message size) over `ranks` ranks,
// `ranks_per_node` of them per node.
struct CommPrice {
  double seconds = 0;
  std::string how;  // "fit shm (2 ranks)", "ring over links", "hierarchical ..."
};
CommPrice price_collective(const HwProfile& hw, const std::string& op, int64_t ranks,
                           int64_t ranks_per_node, double bytes, const std::string& algo = "");

struct StepPart {
  std::string name;
  double seconds = 0;
  double flops = 0;
  std::string detail;
  // The model term it belongs to (Term::name below): "gemm", "attention",
  // "memory", "recompute", "bubble"; GEMMs also carry their dtype and
  // efficiency, from which the small-GEMM term is derived.
  std::string kind;
  std::string dtype;
  double efficiency = 0;
  double weights_s = 0;  // of `seconds`: a CPU GEMM's weight traffic from DRAM
};

// One term of the step-time model, as `anvil plan --explain` prints it: its
// time, how this plan prices it (the formula with its numbers) and where the
// figures come from (measured on this machine, a datasheet, a paper).
struct Term {
  std::string name;
  double seconds = 0;
  std::string how;
  std::string source;
};

struct PlanOptions {
  Layout layout;
  bool overlap = true;           // gradient collectives under backward compute
  double mttf_hours = 0;         // per device; 0: no reliability section
  double ckpt_interval_s = 0;    // 0: the Young/Daly interval
  double ckpt_gbs_per_node = 5;  // storage write bandwidth per node
  double restart_s = 600;        // detect + restart + reload after a failure
};

struct Prediction {
  std::string model, hw;
  Layout layout;
  std::vector<StepPart> compute;  // GEMMs by name, attention, element-wise
  std::vector<StepPart> comm;     // per collective, full and exposed
  std::vector<double> comm_exposed;
  double compute_s = 0, comm_s = 0, comm_exposed_s = 0, optimizer_s = 0, step_s = 0;
  double tokens_per_step = 0, tokens_per_s = 0;
  double model_flops_per_token = 0;  // training FLOPs per token (6N + attention)
  double mfu = 0;
  MemoryPerRank memory;
  double memory_capacity = 0;
  double ckpt_bytes = 0, ckpt_save_s = 0;
  // Reliability (mttf_hours > 0).
  double failures_per_day = 0, system_mttf_s = 0, young_daly_s = 0, ckpt_interval_s = 0,
         goodput = 0;
  double decode_s_per_token = 0;  // batch 1 at the full context: weights + KV cache read
  std::vector<std::string> assumptions;
  std::vector<Term> terms;  // the step time by model term (`anvil plan --explain`)
};

Prediction predict_step(const model::ModelConfig& config, const HwProfile& hw,
                        const PlanOptions& options);

// CPU profiles: the threads of the whole processor (its largest measured
// thread count), the share of it one rank of `layout` gets (1 on a GPU), and
// the profile as that rank sees it (compute and memory rates x share).
int cpu_threads(const HwProfile& hw);
double cpu_rank_share(const HwProfile& hw, const Layout& layout);
HwProfile cpu_rank_view(const HwProfile& hw, double share);

// One decode step of `batch` sequences at `context` tokens each (every
// sequence gets one token): the slower of reading the weights it touches
// (dense weights, the classifier, and of the experts those `batch` tokens
// route to, expected E x (1 - (1 - k/E)^batch) per layer) plus every
// sequence's KV cache at the memory bandwidth, and its FLOPs at the
// achievable GEMM rate.
double decode_seconds_per_step(const model::ModelConfig& config, const HwProfile& hw,
                               const std::string& dtype, int64_t context, int64_t batch);

std::string prediction_text(const Prediction& p);
// The model terms with their formulas and sources (`anvil plan --explain`).
std::string explain_text(const Prediction& p);
std::string prediction_json(const Prediction& p);

}  // namespace anvil::plan
