#include "plan_commands.hpp"

#include "anvil/train/options.hpp"

#include <iostream>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/table.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/param_count.hpp"
#include "anvil/plan/hw_profile.hpp"
#include "anvil/plan/perf_model.hpp"
#include "anvil/plan/sizing_rules.hpp"

namespace anvil::cli {
namespace {

// anvil train's flags that plan has as its own (the same meaning).
const std::vector<std::string> kPlanOwns = {
    "model.config",  "model.set",   "model.dtype",    "train.batch",
    "train.seq",     "train.accum", "optimizer.name", "optimizer.muon_bf16",
    "parallel.zero", "parallel.ep", "parallel.cp"};

}  // namespace

void PlanCommands::add_model_flags(CLI::App* cmd, Model& m, bool required) {
  // `anvil plan comm` needs neither, so plan checks them itself.
  auto* config = cmd->add_option("--config", m.config, "Model config JSON (configs/*.json)");
  if (required) config->required();
  cmd->add_option("--set", m.overrides, "Override a config key: --set key=value (repeatable)");
  cmd->add_option("--hw", m.hw,
                  "Hardware profile: mi300x, h100-sxm, h200-sxm (profiles/) or a file "
                  "from anvil hw --profile FILE");
  add_dtype_option(cmd, "--dtype,--precision", m.dtype, {Dtype::bf16, Dtype::fp32, Dtype::fp8},
                   "GEMM input type (fp8: fp8 GEMMs, bf16 everywhere else)", profile_word);
  cmd->add_option("-B,--batch,--micro-batch", m.micro_batch,
                  "Sequences per forward/backward on one rank (anvil train's --batch)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("-T,--seq", m.seq, "Tokens per sequence (0: the config's seq_len)")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--accum", m.accum,
                  "Micro-batches per optimizer step (anvil train's --accum; the global batch is "
                  "batch x accum x dp unless --global-batch says otherwise)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--nodes", m.nodes, "Nodes")->check(at_least(1));
  cmd->add_option("--gpus-per-node", m.gpus_per_node,
                  "Devices (ranks) per node (default: the profile's devices_per_node; on a CPU "
                  "profile, --dp / --nodes: the ranks share the node's CPU)")
      ->check(at_least(1));
  cmd->add_option("--threads-per-rank", m.threads_per_rank,
                  "CPU profiles: threads one rank runs; it gets that share of the profile's "
                  "whole-CPU compute and memory rates (default: the CPU split evenly over the "
                  "node's ranks)")
      ->check(at_least(1));
  cmd->add_option("--link-gbps", m.link_gbps,
                  "Inter-node link bandwidth per node, Gbit/s (replaces the profile's NICs: one "
                  "link per node)")
      ->check(positive());
  cmd->add_option("--assume", m.assume,
                  "Derate a published profile: memory=F, link=F, gemm=F or gemm.DTYPE=F, each the "
                  "achieved fraction (0, 1] of the datasheet figure (repeatable or "
                  "comma-separated; replaces the profile's achievable value or the default)")
      ->delimiter(',');
  cmd->add_option("--expert-loads", m.expert_loads,
                  "A ZAYA1 run's metrics.jsonl (or run directory): price each expert's GEMMs at "
                  "the rows its router gave it, averaged over the logged steps and layers, skips "
                  "included (default: balanced routing)");
  cmd->add_option("--dp", m.dp,
                  "Data-parallel replicas; the ranks are dp x tp x pp x cp (= nodes x gpus per "
                  "node; sets --nodes)")
      ->check(at_least(1));
  cmd->add_option("--tp", m.tp,
                  "Tensor-parallel ranks (inside a node; heads, ffn and vocabulary split, with "
                  "sequence parallelism)")
      ->check(at_least(1));
  cmd->add_option("--pp", m.pp,
                  "Pipeline stages (1F1B, layers split as evenly as they divide; priced at the "
                  "largest stage)")
      ->check(at_least(1));
  cmd->add_option("--vp", m.vp, "Virtual stages per pipeline rank (interleaved 1F1B)")
      ->check(at_least(1));
  cmd->add_option("--cp", m.cp, "Context-parallel ranks (each holds seq / cp tokens)")
      ->check(at_least(1));
  cmd->add_flag("--fsdp", m.fsdp,
                "FSDP / ZeRO-3: weights, gradients and optimizer state sharded over the "
                "data-parallel ranks, weights gathered per micro-batch");
  cmd->add_option("--ep", m.ep, "Expert-parallel ranks (divides dp and n_experts)")
      ->check(at_least(1));
  cmd->add_flag("--zero", m.zero1, "ZeRO-1: shard optimizer state over the data-parallel ranks");
  cmd->add_option("--global-batch", m.global_batch,
                  "Sequences per optimizer step over all ranks (default: micro-batch x dp)")
      ->check(at_least(1));
  cmd->add_option("--optimizer", m.optimizer, "adamw, or muon (2-D matrices; AdamW for the rest)")
      ->check(one_of({"adamw", "muon"}));
  cmd->add_flag("--muon-bf16", m.muon_bf16,
                "Muon's Newton-Schulz GEMMs on bf16 inputs, priced at the bf16 rate (anvil "
                "train --muon-bf16)");
  cmd->add_flag("--recompute", m.recompute, "Full activation recompute per layer");
  cmd->add_option("--recompute-layers", m.recompute_layers,
                  "Recompute only this many layers per pipeline stage, the others keep their "
                  "activations (Megatron's block method); a count implies --recompute; 0: every "
                  "layer when --recompute is given")
      ->check(CLI::NonNegativeNumber);
}

void PlanCommands::add_to(CLI::App& app, Context& ctx) {
  size_ = app.add_subcommand(
      "size",
      "Count a config's parameters (total and active, per component); with --hw check the "
      "sizing rules and --recommend nearby shapes");
  add_model_flags(size_, size_model_, true);
  size_->add_flag("--json", size_json_, "Print JSON instead of the tables");
  size_->add_flag("--recommend", recommend_,
                  "Search nearby d_model / heads / ffn / experts at the same parameter budget, "
                  "rank them by predicted training throughput, show the Pareto front against "
                  "decode latency at batch 1 and 32, and where the given shape sits (needs --hw)");
  size_->add_option("--top", top_, "Candidates to show with --recommend")->check(at_least(1));
  size_
      ->add_option("--budget-tolerance", tolerance_,
                   "Relative non-embedding parameter range --recommend keeps")
      ->check(in_range(0, 1));

  plan_ = app.add_subcommand(
      "plan",
      "Predict a training step on a hardware profile: compute, exposed communication, optimizer; "
      "tokens/s, MFU, memory per rank, checkpoint and goodput");
  add_model_flags(plan_, plan_model_, false);
  // The rest of anvil train's flags are accepted too (hidden; the planner
  // does not read them), so a train command line is priced unchanged.
  add_options(plan_, train_flags_.train, "train", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.optimizer, "optimizer", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.balancing, "balancing", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.parallel, "parallel", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.checkpoint, "checkpoint", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.metrics, "metrics", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.guard, "guard", ctx, "", kPlanOwns);
  add_options(plan_, train_flags_.faults, "faults", ctx, "", kPlanOwns);
  plan_->add_flag("--no-overlap", no_overlap_,
                  "Gradient collectives do not overlap backward compute");
  plan_
      ->add_option("--mttf-hours", mttf_hours_,
                   "Mean time to failure of one device, hours (adds failures/day and goodput)")
      ->check(positive());
  plan_
      ->add_option("--ckpt-interval-min", ckpt_interval_min_,
                   "Checkpoint interval, minutes (default: the Young/Daly optimum)")
      ->check(positive());
  plan_->add_option("--ckpt-gbs", ckpt_gbs_, "Checkpoint write bandwidth per node, GB/s")
      ->check(positive());
  plan_
      ->add_option("--restart-min", restart_min_,
                   "Minutes from a failure to training again (detect, restart, reload)")
      ->check(at_least(0));
  plan_->add_flag("--json", plan_json_, "Print JSON instead of the table");
  plan_->add_flag("--explain", explain_,
                  "Also print the step time by model term (GEMMs at the plateau, small-GEMM "
                  "efficiency, attention, memory-bound work, optimizer, bubble, exposed "
                  "communication), each with its formula and source (JSON: \"terms\")");

  comm_ = plan_->add_subcommand("comm", "Predict single collectives: time per message size");
  comm_->add_option("--hw", comm_hw_, "Hardware profile name or file")->required();
  comm_->add_option("--op", comm_op_, "allreduce, reduce_scatter, allgather, broadcast, alltoall")
      ->check(one_of({"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall"}))
      ->capture_default_str();
  comm_->add_option("--algo", comm_algo_, "A measured algorithm's fit (default: the fastest)");
  comm_->add_option("--ranks", comm_ranks_, "Ranks")->check(at_least(1))->capture_default_str();
  comm_
      ->add_option("--ranks-per-node", comm_ranks_per_node_,
                   "Ranks per node (default: the profile's devices_per_node; on a CPU "
                   "profile, all of --ranks share this node)")
      ->check(at_least(1));
  comm_->add_option("--sizes", comm_sizes_, "Message sizes, e.g. 1M,16M")
      ->delimiter(',')
      ->capture_default_str();
  comm_
      ->add_option(
          "--assume", comm_assume_,
          "Derate a published profile: memory=F, link=F, gemm=F or gemm.DTYPE=F, each the "
          "achieved fraction (0, 1] of the datasheet figure (repeatable or comma-separated; "
          "replaces the profile's achievable value or the default)")
      ->delimiter(',');
  comm_->add_flag("--json", comm_json_, "Print JSON instead of the table");
  // `anvil plan comm` has its own flags; the parent's --config is not needed then.
  plan_->require_subcommand(0, 1);
}

namespace {

struct Resolved {
  model::ModelConfig config;
  plan::HwProfile hw;
  plan::Layout layout;
};

Resolved resolve(const PlanCommands::Model& m) {
  Resolved r;
  r.config = model::load_model_config(m.config, m.overrides);
  if (!m.hw.empty()) r.hw = plan::find_hw_profile(m.hw, "--hw");
  for (const auto& a : m.assume) plan::apply_assumption(r.hw, a);
  plan::Layout& l = r.layout;
  l.dtype = m.dtype;
  l.micro_batch = m.micro_batch;
  l.seq = m.seq > 0 ? m.seq : r.config.seq_len;
  l.devices_per_node = m.gpus_per_node > 0
                           ? m.gpus_per_node
                           : std::max<int64_t>(1, r.hw.interconnect.devices_per_node);
  // A CPU is one device that its node's ranks share: --dp N --cp C on one
  // node means N x C ranks on this CPU, not N x C nodes.
  if (r.hw.kind == "cpu" && m.gpus_per_node == 0 && (m.dp > 0 || m.tp * m.pp * m.cp > 1)) {
    const int64_t dp = m.dp > 0 ? m.dp : m.nodes;
    if (dp % m.nodes != 0)
      throw InputError("--dp " + std::to_string(dp) + ": expected a multiple of --nodes " +
                       std::to_string(m.nodes));
    l.devices_per_node = dp / m.nodes * m.tp * m.pp * m.cp;
  }
  l.nodes = m.nodes;
  l.threads_per_rank = m.threads_per_rank;
  if (m.link_gbps > 0) {
    r.hw.interconnect.nic_gbps = m.link_gbps;
    r.hw.interconnect.nics_per_node = 1;
  }
  l.tp = m.tp;
  l.pp = m.pp;
  l.vp = m.vp;
  l.cp = m.cp;
  l.fsdp = m.fsdp;
  if (m.dp > 0) {
    const int64_t world = m.dp * m.tp * m.pp * m.cp;
    if (world % l.devices_per_node != 0 && world >= l.devices_per_node)
      throw InputError("--dp " + std::to_string(m.dp) + ": expected dp x tp x pp x cp = " +
                       std::to_string(world) + " ranks to be a multiple of " +
                       std::to_string(l.devices_per_node) + " devices per node");
    if (world < l.devices_per_node) l.devices_per_node = world;
    l.nodes = world / l.devices_per_node;
    if (m.nodes != 1 && l.nodes != m.nodes)
      throw InputError("--nodes " + std::to_string(m.nodes) + ": --dp " + std::to_string(m.dp) +
                       " lays the ranks out on " + std::to_string(l.nodes) +
                       " node(s); drop one of the two");
  }
  l.ep = m.ep;
  l.zero1 = m.zero1;
  if (m.global_batch > 0 && m.accum > 1 && m.global_batch != m.micro_batch * m.accum * l.dp())
    throw InputError("--accum " + std::to_string(m.accum) + ": --global-batch " +
                     std::to_string(m.global_batch) + " is not micro-batch x accum x dp = " +
                     std::to_string(m.micro_batch * m.accum * l.dp()) + "; give one of the two");
  l.global_batch = m.global_batch > 0 ? m.global_batch : m.micro_batch * m.accum * l.dp();
  l.optimizer = m.optimizer;
  if (m.muon_bf16 && m.optimizer != "muon")
    throw InputError("--muon-bf16: needs --optimizer muon, got " + m.optimizer);
  l.muon_bf16 = m.muon_bf16;
  l.recompute = m.recompute || m.recompute_layers > 0;
  l.recompute_layers = m.recompute_layers;
  const int64_t per_stage = (r.config.n_layers + m.pp - 1) / m.pp;
  if (m.recompute_layers > per_stage)
    throw InputError("--recompute-layers: expected at most the " + std::to_string(per_stage) +
                     " layers of a pipeline stage, got " + std::to_string(m.recompute_layers));
  if (!m.expert_loads.empty() && r.config.n_experts == 0)
    throw InputError("--expert-loads: config " + r.config.name + " has no experts to route to");
  if (!m.expert_loads.empty())
    l.expert_shares = plan::expert_shares_from_metrics(m.expert_loads, r.config.n_experts);
  if (m.threads_per_rank > 0) {
    if (r.hw.kind != "cpu")
      throw InputError("--threads-per-rank: for CPU profiles; " + r.hw.name + " is a " + r.hw.kind +
                       " profile");
    const int64_t cpu = plan::cpu_threads(r.hw);
    if (m.threads_per_rank * l.devices_per_node > cpu)
      throw InputError("--threads-per-rank " + std::to_string(m.threads_per_rank) + ": " +
                       std::to_string(l.devices_per_node) + " ranks a node would run " +
                       std::to_string(m.threads_per_rank * l.devices_per_node) +
                       " threads on the profile's " + std::to_string(cpu) + " (expected at most " +
                       std::to_string(cpu / l.devices_per_node) + ")");
  }
  return r;
}

}  // namespace

std::optional<int> PlanCommands::run(Context&) {
  if (comm_ && *comm_) return run_comm();
  if (plan_ && *plan_) return run_plan();
  if (size_ && *size_) return run_size();
  return std::nullopt;
}

int PlanCommands::run_comm() {
  {
    plan::HwProfile hw = plan::find_hw_profile(comm_hw_, "--hw");
    for (const auto& a : comm_assume_) plan::apply_assumption(hw, a);
    // A CPU node hosts all the ranks that share it, as --dp does for plan.
    const int64_t per_node = comm_ranks_per_node_ > 0 ? comm_ranks_per_node_
                             : hw.kind == "cpu"
                                 ? comm_ranks_
                                 : std::max<int64_t>(1, hw.interconnect.devices_per_node);
    Table t({"size", "bytes", "predicted us", "how"});
    nlohmann::json j = nlohmann::json::array();
    for (const auto& text : comm_sizes_) {
      const int64_t bytes = parse_size(text, "--sizes");
      const auto price = plan::price_collective(hw, comm_op_, comm_ranks_, per_node,
                                                static_cast<double>(bytes), comm_algo_);
      t.add_row({text, std::to_string(bytes), fmt(price.seconds * 1e6, 1), price.how});
      j.push_back({{"op", comm_op_},
                   {"ranks", comm_ranks_},
                   {"bytes", bytes},
                   {"predicted_us", price.seconds * 1e6},
                   {"how", price.how}});
    }
    if (comm_json_) {
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "# " << comm_op_ << " on " << hw.name << ", " << comm_ranks_ << " ranks\n"
                << t.to_text();
    }
    return 0;
  }
}

int PlanCommands::run_plan() {
  {
    if (plan_model_.config.empty())
      throw InputError("--config: expected a model config file (configs/*.json)");
    if (plan_model_.hw.empty())
      throw InputError("--hw: expected a hardware profile (mi300x, h100-sxm, h200-sxm or a file)");
    const Resolved r = resolve(plan_model_);
    plan::PlanOptions o;
    o.layout = r.layout;
    o.overlap = !no_overlap_;
    o.mttf_hours = mttf_hours_;
    o.ckpt_interval_s = ckpt_interval_min_ * 60;
    o.ckpt_gbs_per_node = ckpt_gbs_;
    o.restart_s = restart_min_ * 60;
    const auto p = plan::predict_step(r.config, r.hw, o);
    std::cout << (plan_json_ ? plan::prediction_json(p) : plan::prediction_text(p));
    if (explain_ && !plan_json_) std::cout << "\n" << plan::explain_text(p);
    return 0;
  }
}

int PlanCommands::run_size() {
  {
    const Resolved r = resolve(size_model_);
    const auto count = model::count_parameters(r.config);
    if (size_model_.hw.empty()) {
      if (recommend_) throw InputError("--recommend: needs --hw (a hardware profile)");
      std::cout << (size_json_ ? count.to_json() : count.text());
      return 0;
    }
    plan::validate_layout(r.config, r.layout);
    const auto rules = plan::check_sizing_rules(r.config, r.hw, r.layout);
    std::vector<plan::Candidate> candidates;
    if (recommend_) {
      plan::PlanOptions o;
      o.layout = r.layout;
      candidates = plan::recommend(r.config, r.hw, o, tolerance_);
    }
    if (size_json_) {
      nlohmann::json j = {{"parameters", nlohmann::json::parse(count.to_json())},
                          {"hw", r.hw.name},
                          {"rules", nlohmann::json::parse(plan::rules_json(rules))}};
      if (recommend_)
        j["recommend"] = nlohmann::json::parse(plan::candidates_json(candidates, top_));
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << count.text() << "\n# sizing rules on " << r.hw.name << " (" << r.layout.dtype
                << ", micro-batch " << r.layout.micro_batch << " x " << r.layout.seq << ")\n"
                << plan::rules_text(rules);
      if (recommend_) std::cout << "\n" << plan::candidates_text(candidates, top_);
    }
    return 0;
  }
}

std::unique_ptr<CommandFamily> make_plan_commands() {
  return std::make_unique<PlanCommands>();
}

}  // namespace anvil::cli
