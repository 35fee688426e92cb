// The model calculator: what one training step of a config costs, before any
// hardware is involved. Parameters (via model/param_count), the GEMMs and
// attention work per step with their FLOPs (the model family's GEMM list and
// FLOP count, model/family.hpp), memory per rank under data,
// ZeRO-1 and expert parallelism (with and without activation recompute), and
// the bytes each collective moves per step. The perf model (perf_model.hpp)
// prices these on a hardware profile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model/config.hpp"
#include "anvil/model/gemm_shapes.hpp"
#include "anvil/model/param_count.hpp"

namespace anvil::plan {

// How a step is laid out over ranks. world = nodes * devices_per_node =
// dp * tp * pp * cp; tensor (tp) and context (cp) parallel groups sit inside a
// node, pipeline stages (pp) and data-parallel replicas (dp) across nodes;
// experts are split over `ep` ranks (ep divides dp) and replicated over dp/ep.
struct Layout {
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  int64_t ep = 1;
  int64_t tp = 1;      // tensor parallel: heads, ffn and vocabulary split (with sequence parallel)
  int64_t pp = 1;      // pipeline stages (1F1B; the layers split as evenly as they divide)
  int64_t vp = 1;      // virtual stages per rank (interleaved 1F1B): bubble / vp
  int64_t cp = 1;      // context parallel: each rank holds seq / cp tokens of a sequence
  bool zero1 = false;  // optimizer state sharded over the replicas (dp x cp)
  bool fsdp = false;   // ZeRO-3 / FSDP: weights, gradients and optimizer state sharded
  int64_t global_batch = 1;         // sequences per optimizer step, all ranks
  int64_t micro_batch = 1;          // sequences per forward/backward on one rank
  int64_t seq = 1024;               // tokens per sequence
  std::string dtype = "bf16";       // GEMM inputs: f32 | bf16 | fp8 (fp8 GEMMs, bf16 elsewhere)
  std::string optimizer = "adamw";  // adamw | muon (Muon on 2-D matrices, AdamW on the rest)
  bool muon_bf16 = false;           // Muon's Newton-Schulz GEMMs on bf16 inputs (--muon-bf16)
  bool recompute = false;           // full activation recompute per layer
  int64_t recompute_layers = 0;     // with recompute: layers per stage recomputed (0: all)
  // CPU profiles: threads one rank runs. The rank gets that share of the
  // profile's whole-CPU rates (compute, memory); 0: the CPU split evenly
  // over the node's ranks (devices_per_node).
  int64_t threads_per_rank = 0;
  // Routing as a run measured it (anvil plan --expert-loads): each expert's
  // share of the router's assignments, the skip expert last (n_experts + 1
  // entries, summing to 1). Empty: balanced routing, no skips. Expert GEMMs
  // are priced at each expert's own rows; under EP, the busiest rank's.
  std::vector<double> expert_shares;
  int64_t world() const { return nodes * devices_per_node; }
  int64_t dp() const { return world() / (tp * pp * cp); }
  // Ranks holding the same weights: the data-parallel replicas and, within
  // each, the context-parallel ranks (which see other tokens of the same
  // sequences). Gradients are summed and ZeRO / FSDP shard over these.
  int64_t replicas() const { return dp() * cp; }
  int64_t accumulation() const;  // micro-batches per optimizer step on one rank
};

// Throws InputError naming the flag when the layout is inconsistent.
void validate_layout(const model::ModelConfig& config, const Layout& layout);

// The layers of the largest pipeline stage: the n_layers split into pp x vp
// chunks as evenly as they divide (the first chunks one layer larger), stage
// s holding chunks s, s + pp, ...; n_layers when pp is 1. A step runs at its
// slowest stage's pace and the first stage holds the most activations, so
// the planner prices this stage (n_layers / pp when pp divides them).
int64_t stage_layers(const model::ModelConfig& config, const Layout& layout);

// Each expert's share of the routed assignments (the skip expert last),
// averaged over every MoE layer of every step a run logged in `path` (its
// metrics.jsonl, or the run directory holding it). InputError naming the
// file when it has no router loads or another expert count.
std::vector<double> expert_shares_from_metrics(const std::string& path, int64_t n_experts);

// One GEMM of a step, `count` times (e.g. once per layer).
struct StepGemm {
  model::GemmShape shape;
  int64_t count = 1;
  bool expert = false;  // an expert GEMM (tokens per expert from the routing)
};

// The part of a config one tensor-parallel rank computes: heads, KV heads,
// ffn widths and the vocabulary divided by tp (the others unchanged).
model::ModelConfig tensor_parallel_shard(const model::ModelConfig& config, int64_t tp);

// The GEMMs of one micro-batch forward + backward on one rank: per-layer
// GEMMs x n_layers (all layers: a pipeline stage runs 1/pp of them, which
// the perf model applies), the classifier once; with tp, the rank's shard
// (tensor_parallel_shard), with cp, seq / cp tokens. Expert GEMMs at the balanced
// tokens per expert (tokens * top_k / n_experts; with EP a rank holds
// n_experts / ep experts and receives ep times the tokens per expert).
std::vector<StepGemm> step_gemms(const model::ModelConfig& config, const Layout& layout,
                                 bool backward);

// Causal attention of one micro-batch on one rank (QK^T and PV, forward and,
// with backward, twice that again): FLOPs and the per-(sequence, head) GEMM
// shape [T x T x head_dim] the kernels tile over.
struct AttentionWork {
  double flops = 0;
  int64_t problems = 0;  // sequences x query heads
  int64_t T = 0, head_dim = 0;
};
AttentionWork step_attention(const model::ModelConfig& config, const Layout& layout, bool backward);

// Bytes per rank.
struct MemoryPerRank {
  double weights = 0;      // fp32 master weights (+ a bf16 copy when dtype is bf16)
  double gradients = 0;    // fp32 (twice over when accumulating: the earlier micro-batches' sum)
  double optimizer = 0;    // AdamW m, v; Muon momentum (sharded by ZeRO-1)
  double activations = 0;  // saved for backward, one micro-batch
  double activations_no_recompute = 0;
  double activations_recompute = 0;
  double total() const { return weights + gradients + optimizer + activations; }
};
MemoryPerRank memory_per_rank(const model::ModelConfig& config, const Layout& layout);

// The share of a stage's layers that recompute their forward in backward: 0
// without recompute, 1 with all of them, recompute_layers / (L / pp) else.
double recompute_share(const model::ModelConfig& config, const Layout& layout);

// Parameters a rank holds: replicated ones and its share of the experts.
struct LocalParams {
  double replicated = 0;  // on every rank (embeddings, attention, router, norms)
  double expert = 0;      // this rank's experts
  double matrices = 0;    // of those, in 2-D matrices other than embeddings (Muon's group)
  double total() const { return replicated + expert; }
};
LocalParams local_params(const model::ModelConfig& config, const Layout& layout);

// One collective of a step: who runs it, how big one call is, how often.
struct CommOp {
  std::string op;     // allreduce | reduce_scatter | allgather | alltoall
  std::string group;  // dp | expert-dp | ep | tp | cp | pp
  std::string what;   // "gradients", "parameters", "token dispatch", ...
  int64_t ranks = 1;
  double bytes = 0;            // message size of one call, as nccl-tests counts it
  int64_t calls = 0;           // per optimizer step
  bool overlappable = false;   // may run under backward compute
  int64_t ranks_per_node = 1;  // of the group's ranks, how many share a node
};
std::vector<CommOp> comm_per_step(const model::ModelConfig& config, const Layout& layout);

}  // namespace anvil::plan
