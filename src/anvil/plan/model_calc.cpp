#include "anvil/plan/model_calc.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/kernels/layers.hpp"
#include "anvil/model/context_parallel.hpp"
#include "anvil/model/family.hpp"

namespace anvil::plan {
namespace {

// Bytes of an activation, weight copy or message element: fp8 runs keep
// activations and communication in bf16.
double bytes_of(const std::string& dtype) {
  return dtype == "f32" ? 4.0 : 2.0;
}

double as_double(int64_t v) {
  return static_cast<double>(v);
}

// Parameters by kind, from the same count `anvil size` prints.
struct ParamSplit {
  double embedding = 0, expert = 0, vectors = 0, other = 0;
};

ParamSplit split_params(const model::ModelConfig& c) {
  const model::ParamCount n = model::count_parameters(c);
  ParamSplit s;
  for (const auto& comp : n.components) {
    const double v = static_cast<double>(comp.total);
    if (comp.embedding) {
      s.embedding += v;
    } else if (comp.component == "experts") {
      s.expert += v;
    } else if (comp.component == "norms" || comp.component == "residual scaling") {
      s.vectors += v;
    } else {
      s.other += v;
    }
  }
  return s;
}

}  // namespace

int64_t Layout::accumulation() const {
  return global_batch / (micro_batch * dp());
}

void validate_layout(const model::ModelConfig& c, const Layout& l) {
  auto positive = [](int64_t v, const std::string& flag) {
    if (v < 1) throw InputError(flag + ": expected a positive integer, got " + std::to_string(v));
  };
  positive(l.nodes, "--nodes");
  positive(l.devices_per_node, "--gpus-per-node");
  positive(l.ep, "--ep");
  positive(l.tp, "--tp");
  positive(l.pp, "--pp");
  positive(l.vp, "--vp");
  positive(l.cp, "--cp");
  positive(l.micro_batch, "--micro-batch");
  positive(l.seq, "--seq");
  positive(l.global_batch, "--global-batch");
  // Token counts far inside int64 (and double's exact integers): beyond,
  // the products would wrap to negative times and memory that "fits".
  constexpr int64_t kMaxTokens = int64_t{1} << 50;
  if (l.micro_batch > kMaxTokens / l.seq || l.global_batch > kMaxTokens / l.seq)
    throw InputError("--micro-batch " + std::to_string(l.micro_batch) + ", --global-batch " +
                     std::to_string(l.global_batch) + " x --seq " + std::to_string(l.seq) +
                     ": expected at most 2^50 tokens per step");
  if (c.position == model::Position::learned && l.seq > c.seq_len)
    throw InputError("--seq " + std::to_string(l.seq) + ": above the config's seq_len " +
                     std::to_string(c.seq_len) + ", which its learned positions cannot reach");
  if (l.dtype != "f32" && l.dtype != "bf16" && l.dtype != "fp8")
    throw InputError("--dtype: expected f32, bf16 or fp8, got '" + l.dtype + "'");
  if (l.world() % (l.tp * l.pp * l.cp) != 0)
    throw InputError("--tp " + std::to_string(l.tp) + " x --pp " + std::to_string(l.pp) +
                     " x --cp " + std::to_string(l.cp) + ": expected a divisor of the " +
                     std::to_string(l.world()) + " ranks (nodes x gpus per node)");
  if (l.tp > l.devices_per_node || l.devices_per_node % l.tp != 0)
    throw InputError("--tp " + std::to_string(l.tp) + ": expected a divisor of the node's " +
                     std::to_string(l.devices_per_node) +
                     " devices (tensor parallelism stays inside a node)");
  if (l.tp > 1 && (c.n_heads % l.tp != 0 || (c.n_kv_heads % l.tp != 0 && l.tp % c.n_kv_heads != 0)))
    throw InputError("--tp " + std::to_string(l.tp) + ": expected a divisor of n_heads " +
                     std::to_string(c.n_heads) + " (and of n_kv_heads " +
                     std::to_string(c.n_kv_heads) + ", or a multiple of it)");
  if (l.tp > 1 &&
      (c.ffn_hidden % l.tp != 0 || (c.n_experts > 0 && c.expert_ffn_hidden % l.tp != 0)))
    throw InputError("--tp " + std::to_string(l.tp) + ": expected a divisor of ffn_hidden " +
                     std::to_string(c.ffn_hidden) +
                     (c.n_experts > 0
                          ? " and expert_ffn_hidden " + std::to_string(c.expert_ffn_hidden)
                          : std::string()));
  // The trainer's layout: each sequence in 2 x cp chunks (the causal load
  // balanced), of at least 2 tokens.
  if (l.cp > 1 && (l.seq % (2 * l.cp) != 0 || l.seq / (2 * l.cp) < 2))
    throw InputError("--cp " + std::to_string(l.cp) +
                     ": expected --seq a multiple of 2 x cp = " + std::to_string(2 * l.cp) +
                     " with chunks of at least 2 tokens, got " + std::to_string(l.seq));
  if (l.vp > 1 && l.pp == 1) throw InputError("--vp " + std::to_string(l.vp) + ": needs --pp > 1");
  if (l.pp * l.vp > c.n_layers)
    throw InputError("--pp " + std::to_string(l.pp) +
                     (l.vp > 1 ? " x --vp " + std::to_string(l.vp) : std::string()) +
                     ": more stages than the config's " + std::to_string(c.n_layers) +
                     " layers (expected at least one layer a stage)");
  if (l.fsdp && l.zero1) throw InputError("--fsdp: already shards what --zero shards; give one");
  if (l.optimizer != "adamw" && l.optimizer != "muon")
    throw InputError("--optimizer: expected adamw or muon, got '" + l.optimizer + "'");
  if (l.ep > 1 && c.n_experts == 0)
    throw InputError("--ep " + std::to_string(l.ep) + ": config " + c.name + " has no experts");
  if (l.replicas() % l.ep != 0)
    throw InputError("--ep " + std::to_string(l.ep) + ": expected a divisor of the " +
                     std::to_string(l.replicas()) + " data- and context-parallel ranks");
  if (c.n_experts > 0 && c.n_experts % l.ep != 0)
    throw InputError("--ep " + std::to_string(l.ep) + ": expected a divisor of n_experts " +
                     std::to_string(c.n_experts));
  if (l.global_batch % (l.micro_batch * l.dp()) != 0)
    throw InputError(
        "--global-batch " + std::to_string(l.global_batch) +
        ": expected a multiple of micro-batch x ranks = " + std::to_string(l.micro_batch * l.dp()));
}

std::vector<double> expert_shares_from_metrics(const std::string& path, int64_t n_experts) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = path + "/metrics.jsonl";
  std::ifstream in(file);
  if (!in)
    throw InputError("--expert-loads " + file + ": cannot open (expected a run's metrics.jsonl)");
  std::vector<double> sum(static_cast<size_t>(n_experts + 1), 0.0);
  std::string line;
  int64_t layers = 0, number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw InputError("--expert-loads " + file + ":" + std::to_string(number) +
                       ": not a JSON line");
    }
    if (!j.contains("router") || !j["router"].is_array()) continue;
    for (const auto& layer : j["router"]) {
      const auto& load = layer.value("load", nlohmann::json::array());
      if (!load.is_array() || static_cast<int64_t>(load.size()) != n_experts + 1)
        throw InputError("--expert-loads " + file + ":" + std::to_string(number) + ": expected " +
                         std::to_string(n_experts + 1) +
                         " loads per layer (the config's experts and the skip expert), got " +
                         std::to_string(load.size()));
      for (size_t e = 0; e < sum.size(); ++e) {
        const double v = load[e].is_number() ? load[e].get<double>() : -1.0;
        if (!(v >= 0) || !std::isfinite(v))
          throw InputError("--expert-loads " + file + ":" + std::to_string(number) +
                           ": a load of " + load[e].dump() +
                           " (expected token counts: finite, not negative)");
        sum[e] += v;
      }
      ++layers;
    }
  }
  double total = 0;
  for (double v : sum) total += v;
  if (layers == 0 || !(total > 0))
    throw InputError("--expert-loads " + file +
                     ": no router loads (expected a ZAYA1 run's metrics)");
  for (double& v : sum) v /= total;
  return sum;
}

model::ModelConfig tensor_parallel_shard(const model::ModelConfig& config, int64_t tp) {
  model::ModelConfig c = config;
  if (tp <= 1) return c;
  c.n_heads /= tp;
  c.n_kv_heads = std::max<int64_t>(1, c.n_kv_heads / tp);  // KV heads replicated when tp > kv
  c.ffn_hidden = (c.ffn_hidden + tp - 1) / tp;
  if (c.n_experts > 0) c.expert_ffn_hidden = (c.expert_ffn_hidden + tp - 1) / tp;
  c.vocab_size = (c.vocab_size + tp - 1) / tp;
  return c;
}

std::vector<StepGemm> step_gemms(const model::ModelConfig& config, const Layout& l, bool backward) {
  const model::ModelConfig c = tensor_parallel_shard(config, l.tp);
  const int64_t tokens = l.micro_batch * l.seq / l.cp;
  // Balanced routing: each expert gets tokens*top_k/E of every rank's tokens;
  // with EP a rank hosts E/ep experts and receives from ep ranks.
  const int64_t per_expert =
      c.n_experts > 0 ? std::max<int64_t>(1, tokens * c.top_k * l.ep / c.n_experts) : 0;
  const int64_t experts_here = c.n_experts > 0 ? c.n_experts / l.ep : 0;
  // Measured routing: rows per expert of the busiest rank -> experts with that many.
  std::map<int64_t, int64_t> measured_rows;
  const bool measured = c.n_experts > 0 && !l.expert_shares.empty();
  if (measured) {
    if (static_cast<int64_t>(l.expert_shares.size()) != c.n_experts + 1)
      throw InputError("--expert-loads: expected " + std::to_string(c.n_experts + 1) +
                       " shares for config " + c.name);
    int64_t busiest = 0;
    double most = -1;
    for (int64_t g = 0; g < l.ep; ++g) {
      double sum = 0;
      for (int64_t e = g * experts_here; e < (g + 1) * experts_here; ++e) sum += l.expert_shares[e];
      if (sum > most) {
        most = sum;
        busiest = g;
      }
    }
    for (int64_t e = busiest * experts_here; e < (busiest + 1) * experts_here; ++e) {
      const auto rows = static_cast<int64_t>(
          std::llround(static_cast<double>(tokens * c.top_k * l.ep) * l.expert_shares[e]));
      if (rows > 0) ++measured_rows[rows];
    }
  }
  std::vector<StepGemm> out;
  for (auto& g : model::layer_gemms(c, tokens, per_expert, backward)) {
    const bool head = g.name.rfind("lm_head", 0) == 0;
    const bool expert = g.name.rfind("expert.", 0) == 0;
    if (expert && measured) continue;
    const int64_t count = head ? 1 : expert ? c.n_layers * experts_here : c.n_layers;
    out.push_back({g, count, expert});
  }
  for (const auto& [rows, experts] : measured_rows) {
    for (auto& g : model::layer_gemms(c, tokens, rows, backward)) {
      if (g.name.rfind("expert.", 0) == 0) out.push_back({g, c.n_layers * experts, true});
    }
  }
  return out;
}

AttentionWork step_attention(const model::ModelConfig& c, const Layout& l, bool backward) {
  AttentionWork w;
  w.T = l.seq;
  w.head_dim = c.head_dim;
  w.problems = l.micro_batch * (c.n_heads / l.tp) * c.n_layers;
  // Context parallel: each rank does 1/cp of it (load-balanced chunks).
  const double per_problem = model::causal_attention_flops(c.head_dim, l.seq);
  w.flops = per_problem * static_cast<double>(w.problems) * (backward ? 3.0 : 1.0) /
            static_cast<double>(l.cp);
  return w;
}

LocalParams local_params(const model::ModelConfig& c, const Layout& l) {
  const ParamSplit s = split_params(c);
  LocalParams p;
  // Tensor and pipeline parallel split every weight (norms and biases too,
  // to first order; the largest pipeline stage's share of the layers);
  // FSDP's shards are counted in memory_per_rank.
  const double split = as_double(l.tp) * as_double(c.n_layers) / as_double(stage_layers(c, l));
  p.replicated = (s.embedding + s.vectors + s.other) / split;
  p.expert = s.expert / static_cast<double>(l.ep) / split;
  p.matrices = s.other / split + p.expert;
  return p;
}

int64_t stage_layers(const model::ModelConfig& c, const Layout& l) {
  if (l.pp <= 1) return c.n_layers;
  const int64_t chunks = l.pp * std::max<int64_t>(1, l.vp);
  std::vector<int64_t> stage(static_cast<size_t>(l.pp), 0);
  for (int64_t k = 0; k < chunks; ++k)
    stage[static_cast<size_t>(k % l.pp)] += c.n_layers / chunks + (k < c.n_layers % chunks ? 1 : 0);
  return *std::max_element(stage.begin(), stage.end());
}

double recompute_share(const model::ModelConfig& c, const Layout& l) {
  if (!l.recompute) return 0;
  const double stage = as_double(stage_layers(c, l));
  if (l.recompute_layers <= 0 || as_double(l.recompute_layers) >= stage) return 1;
  return as_double(l.recompute_layers) / stage;
}

MemoryPerRank memory_per_rank(const model::ModelConfig& c, const Layout& l) {
  const LocalParams p = local_params(c, l);
  MemoryPerRank m;
  m.weights = p.total() * (l.dtype == "f32" ? 4.0 : 6.0);
  m.gradients = p.total() * 4.0;
  // AdamW keeps m and v (8 B); Muon keeps one momentum (4 B) for its matrices.
  const double adam_params = l.optimizer == "muon" ? p.total() - p.matrices : p.total();
  const double muon_params = l.optimizer == "muon" ? p.matrices : 0.0;
  double replicated_share = p.replicated / p.total();
  double state = (adam_params * 8.0 + muon_params * 4.0);
  const double dp = static_cast<double>(l.replicas());
  const double expert_dp = dp / static_cast<double>(l.ep);
  // Over the ranks holding the same weights (dp x cp): replicated parameters
  // over all of them, the experts over their dp x cp / ep replicas.
  auto shard = [&](double bytes) {
    return bytes * replicated_share / dp + bytes * (1 - replicated_share) / expert_dp;
  };
  if (l.zero1 || l.fsdp) state = shard(state);
  if (l.fsdp) {
    m.weights = shard(m.weights);
    m.gradients = shard(m.gradients);
  }
  // Accumulating over micro-batches, the trainer computes each one's
  // gradients alone and keeps the earlier ones' sum beside them (so a step's
  // sum does not depend on how its rows are split): a second gradient buffer.
  if (l.accumulation() > 1) m.gradients *= 2;
  m.optimizer = state;

  // Activations saved for backward, elements per token per layer.
  const double C = static_cast<double>(c.d_model);
  const model::BlockActivations saved = model::model_family(c).saved_activations(c, l.ep > 1);
  // Tensor parallel with sequence parallelism splits every saved activation.
  const double per_token_layer = (saved.attention + saved.mlp) / as_double(l.tp);
  const double tokens = static_cast<double>(l.micro_batch * l.seq / l.cp);
  // A pipeline stage holds its layers' activations of up to pp micro-batches
  // in flight (1F1B, the first stage, which is also the largest).
  const double in_flight = l.pp > 1 ? as_double(std::min(l.pp, l.accumulation())) : 1.0;
  const double L = as_double(stage_layers(c, l)) * in_flight;
  const double act = bytes_of(l.dtype);
  // The classifier runs in chunks of rows (logits and their gradient, fp32).
  const double classifier = 2.0 * static_cast<double>(kernels::kClassifierChunk) *
                            static_cast<double>(c.vocab_size / l.tp) * 4.0;
  const double final_norm = 2 * C * tokens * act;
  // Context parallel: the whole sequence's keys and values and their
  // gradients, shared by the layers (the trainer's own buffers, at the
  // activation width).
  const int64_t kv_heads = std::max<int64_t>(1, c.n_kv_heads / l.tp);
  const double context =
      as_double(static_cast<int64_t>(model::ContextParallel::scratch_bytes(
          l.micro_batch, l.seq, static_cast<int>(l.cp), 2 * kv_heads * c.head_dim))) *
      act / 4.0;
  m.activations_no_recompute =
      L * per_token_layer * tokens * act + classifier + final_norm + context;
  // Recompute: keep each layer's input; re-run one layer at a time in backward.
  m.activations_recompute =
      L * C * tokens * act + per_token_layer * tokens * act + classifier + final_norm + context;
  // Recomputing only some layers of a stage (Megatron's "block" method): those
  // keep their inputs, the others everything.
  const double share = recompute_share(c, l);
  m.activations =
      share * m.activations_recompute + (1 - share) * m.activations_no_recompute;
  return m;
}

std::vector<CommOp> comm_per_step(const model::ModelConfig& c, const Layout& l) {
  std::vector<CommOp> out;
  const LocalParams p = local_params(c, l);
  const double weight_bytes = bytes_of(l.dtype);
  // Tensor and context parallel groups fill a node first; data-parallel
  // replicas and pipeline stages span nodes. A node holds devices / tp of
  // the ranks that share weights (its cp ranks and dp replicas).
  const int64_t replicas_per_node =
      std::max<int64_t>(1, l.devices_per_node / std::min(l.devices_per_node, l.tp));
  const int64_t micro = l.accumulation();
  auto gradients = [&](const std::string& group, int64_t ranks, double params) {
    if (ranks < 2 || params <= 0) return;
    const int64_t per_node = std::min(ranks, replicas_per_node);
    if (l.fsdp) {
      // Weights gathered for forward and again for backward, every micro-batch.
      out.push_back({"allgather", group, "parameters (forward + backward)", ranks,
                     params * weight_bytes, 2 * micro, true, per_node});
      out.push_back(
          {"reduce_scatter", group, "gradients (fp32)", ranks, params * 4.0, 1, true, per_node});
    } else if (l.zero1) {
      out.push_back(
          {"reduce_scatter", group, "gradients (fp32)", ranks, params * 4.0, 1, true, per_node});
      out.push_back({"allgather", group, "updated parameters", ranks, params * weight_bytes, 1,
                     true, per_node});
    } else {
      out.push_back(
          {"allreduce", group, "gradients (fp32)", ranks, params * 4.0, 1, true, per_node});
    }
  };
  // Gradients are summed over every rank holding the same weights: the
  // data-parallel replicas and their context-parallel ranks.
  const std::string group = l.cp > 1 ? "dp x cp" : "dp";
  if (l.ep == 1) {
    gradients(group, l.replicas(), p.replicated + p.expert);
  } else {
    gradients(group, l.replicas(), p.replicated);
    gradients("expert-" + group, l.replicas() / l.ep, p.expert);
  }
  const int64_t tokens = l.micro_batch * l.seq / l.cp;
  const int64_t layers = stage_layers(c, l);
  if (l.ep > 1) {
    // Dispatch and combine in forward, and both again in backward, per MoE layer.
    const double bytes = as_double(tokens * c.top_k * c.d_model) * bytes_of(l.dtype);
    out.push_back({"alltoall", "ep", "token dispatch + combine", l.ep, bytes, 4 * layers * micro,
                   false, std::min(l.ep, replicas_per_node)});
  }
  if (l.tp > 1) {
    // Sequence parallel: an all-gather before and a reduce-scatter after the
    // attention and the MLP block, forward and backward (as much as 4
    // all-reduces of the block's output per layer).
    const double bytes = as_double(tokens * c.d_model) * bytes_of(l.dtype);
    out.push_back({"allreduce", "tp", "activations (sequence parallel)", l.tp, bytes,
                   4 * layers * micro, false, std::min(l.tp, l.devices_per_node)});
  }
  if (l.cp > 1) {
    // Keys and values of the whole sequence gathered per layer in forward,
    // their gradients reduce-scattered in backward.
    const int64_t kv_heads = std::max<int64_t>(1, c.n_kv_heads / l.tp);  // the rank's heads
    const double bytes = as_double(tokens * l.cp * 2 * (kv_heads * c.head_dim)) * bytes_of(l.dtype);
    const int64_t per_node = std::min(l.cp, std::max<int64_t>(1, l.devices_per_node / l.tp));
    out.push_back(
        {"allgather", "cp", "keys and values", l.cp, bytes, layers * micro, false, per_node});
    out.push_back({"reduce_scatter", "cp", "key and value gradients", l.cp, bytes, layers * micro,
                   false, per_node});
    if (c.attention == model::Attention::cca) {
      // CCA's halos: the two q|k latent rows (at most the heads' width) and
      // the value row before each of a rank's two chunks, in forward, and
      // their gradients back in backward.
      const double row = as_double(l.micro_batch * (2 * (c.n_heads + kv_heads) + 1) * c.head_dim);
      out.push_back({"sendrecv", "cp", "CCA halo rows", 2, 2 * row * bytes_of(l.dtype),
                     2 * layers * micro, false, per_node});
    }
  }
  if (l.pp > 1) {
    // Activations to the next stage and their gradients back, per micro-batch
    // (sequence-parallel shards: 1/tp of them per rank).
    const double bytes = as_double(tokens * c.d_model) * bytes_of(l.dtype) / as_double(l.tp);
    const bool same_node = l.tp * l.cp * l.pp <= l.devices_per_node;
    out.push_back({"sendrecv", "pp", "stage activations + gradients", 2, bytes, 2 * micro, false,
                   same_node ? 2 : 1});
  }
  return out;
}

}  // namespace anvil::plan
