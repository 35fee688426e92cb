// Hardware-aware sizing rules (after Anthony et al. 2024, "The Case for
// Co-Designing Model Architectures with Hardware", and the ZAYA1 paper's
// MI300X sizing study): each rule looks at one dimension or one GEMM of a
// config on a hardware profile, passes or warns, predicts the fraction of
// that GEMM's time it loses, and suggests a nearby dimension. `recommend`
// searches nearby shapes at the same parameter budget for the best predicted
// training throughput and shows decode latency next to it.
#pragma once

#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/plan/perf_model.hpp"

namespace anvil::plan {

struct RuleResult {
  std::string rule;     // alignment | tile quantization | wave quantization | head dimension |
                        // GEMM work | expert width | vocabulary padding
  std::string subject;  // "d_model = 1000", "mlp.up.fwd [4096 x 6144 x 1536]"
  bool pass = true;
  double loss = 0;         // predicted fraction of the GEMM's time lost (0 when it passes)
  std::string suggestion;  // a nearby dimension that passes, or advice
  std::string detail;
};

// The rules' explanations and sources, one per rule name.
struct RuleInfo {
  std::string rule, why, source;
};
const std::vector<RuleInfo>& rule_catalogue();

// Elements a dimension should be a multiple of for `dtype` on `hw`: 128
// bytes on a GPU (a 64-element bf16 MFMA/tensor-core K step), one 64-byte
// vector register on a CPU.
int64_t alignment_elements(const HwProfile& hw, const std::string& dtype);

RuleResult check_alignment(const std::string& name, int64_t value, const HwProfile& hw,
                           const std::string& dtype);
RuleResult check_gemm_quantization(const std::string& name, int64_t m, int64_t n, int64_t k,
                                   const HwProfile& hw, const std::string& dtype, bool wave);

std::vector<RuleResult> check_sizing_rules(const model::ModelConfig& config, const HwProfile& hw,
                                           const Layout& layout);

struct Candidate {
  model::ModelConfig config;
  std::string change;  // what differs from the input config
  double non_embedding_total = 0, non_embedding_active = 0;
  Prediction prediction;
  // One decode step of 32 sequences (each gets a token); batch 1 is
  // prediction.decode_s_per_token.
  double decode_b32_s = 0;
  bool pareto = false;      // no other candidate trains faster and decodes faster at 1 and 32
  int warnings = 0;
};

// The decode batch the Pareto front weighs next to batch 1.
inline constexpr int64_t kDecodeBatch = 32;

// Nearby configs (d_model, heads x head_dim, ffn or expert width, experts)
// whose non-embedding parameters are within `budget_tolerance` of the
// input's, best predicted training tokens/s first; the input is always in
// the list (change "as given"). Each is marked `pareto` when none of the
// others is at least as good in training tokens/s and decode latency at
// batch 1 and 32, and better in one.
std::vector<Candidate> recommend(const model::ModelConfig& config, const HwProfile& hw,
                                 const PlanOptions& options, double budget_tolerance = 0.05);

// y is at least as good as x in training tokens/s and both decode latencies,
// and better in one.
bool dominates(const Candidate& y, const Candidate& x);
// The front (every candidate, not only --top) and where the given shape sits:
// on it, or dominated by which shape and by how much.
std::string pareto_text(const std::vector<Candidate>& candidates);

std::string rules_text(const std::vector<RuleResult>& rules);
std::string rules_json(const std::vector<RuleResult>& rules);
std::string candidates_text(const std::vector<Candidate>& candidates, size_t top);
std::string candidates_json(const std::vector<Candidate>& candidates, size_t top);

}  // namespace anvil::plan
