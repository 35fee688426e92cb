// The planner's commands: `anvil size` (parameters; with --hw the sizing
// rules and --recommend) and `anvil plan` (step-time prediction; `anvil plan
// comm` for single collectives). The batch, sequence, dtype and parallelism
// flags are anvil train's, and plan accepts train's other flags too, so a
// train command line is priced unchanged. Flags only; the work is in
// src/anvil/plan.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "anvil/train/options.hpp"
#include "cli.hpp"

namespace anvil::cli {

class PlanCommands : public CommandFamily {
 public:
  void add_to(CLI::App& app, Context& ctx) override;
  std::optional<int> run(Context& ctx) override;

  struct Model {
    std::string config;
    std::vector<std::string> overrides;
    std::string hw;
    std::string dtype = "bf16";
    int64_t micro_batch = 1;
    int64_t seq = 0;
    int64_t accum = 1;
    int64_t nodes = 1;
    int64_t gpus_per_node = 0;
    int64_t dp = 0;
    int64_t ep = 1;
    int64_t tp = 1, pp = 1, vp = 1, cp = 1;
    bool zero1 = false;
    bool fsdp = false;
    int64_t global_batch = 0;
    std::string optimizer = "adamw";
    bool muon_bf16 = false;
    bool recompute = false;
    int64_t recompute_layers = 0;
    int64_t threads_per_rank = 0;
    double link_gbps = 0;
    std::vector<std::string> assume;  // --assume KEY=FRACTION
    std::string expert_loads;         // --expert-loads RUN/metrics.jsonl
  };

 private:
  void add_model_flags(CLI::App* cmd, Model& m, bool required);
  int run_comm();
  int run_plan();
  int run_size();

  CLI::App* size_ = nullptr;
  CLI::App* plan_ = nullptr;
  CLI::App* comm_ = nullptr;
  Model size_model_, plan_model_;
  train::TrainOptions train_flags_;  // accepted, not read
  bool size_json_ = false, recommend_ = false, plan_json_ = false, comm_json_ = false;
  bool explain_ = false;
  size_t top_ = 10;
  double tolerance_ = 0.05;
  bool no_overlap_ = false;
  double mttf_hours_ = 0, ckpt_interval_min_ = 0, ckpt_gbs_ = 5, restart_min_ = 10;
  std::string comm_hw_, comm_op_ = "allreduce", comm_algo_;
  std::vector<std::string> comm_assume_;
  std::vector<std::string> comm_sizes_ = {"1M", "4M", "16M", "64M"};
  int64_t comm_ranks_ = 2, comm_ranks_per_node_ = 0;
};

}  // namespace anvil::cli
