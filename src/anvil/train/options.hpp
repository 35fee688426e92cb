// `anvil train`'s options, one section per component that reads it. Each
// section declares its options once (base/options.hpp): the CLI, run files
// (`anvil train --train FILE`), the record a run leaves (RUN/train.json) and
// the checks all read the same list, and each component receives its own
// section from the Trainer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/options.hpp"
#include "anvil/ft/guard.hpp"
#include "anvil/ft/injector.hpp"
#include "anvil/model/zaya_balancing.hpp"
#include "anvil/optim/optimizer_options.hpp"
#include "anvil/parallel/parallel_options.hpp"

namespace anvil::train {

// What is trained: the model config and the number type of its GEMMs.
struct ModelOptions {
  std::string config;
  std::vector<std::string> set;
  std::string dtype = "fp32";
  std::string device = "cpu";
  bool tf32 = false;
  template <class V>
  void describe(V& v) {
    v({.name = "config", .help = "Model config JSON (configs/*.json)"}, config);
    v({.name = "set", .help = "Override a config key: --set key=value (repeatable)"}, set);
    v({.name = "dtype",
       .help = "GEMM inputs: fp32, or bf16 (bf16 inputs, fp32 accumulation, master weights and "
               "gradients; AVX512_BF16 via oneDNN, else widened to fp32; ZAYA1: its CCA "
               "projections and experts in bf16, the router and the rest fp32); aliases f32, "
               "float32, bfloat16",
       .aliases = {"--precision"}},
      dtype);
    v({.name = "device",
       .help = "Where the model trains: cpu, or cuda (one GPU per process; the dense family "
               "(gpt2, llama configs), fp32 or bf16; AdamW, Muon (without --zero) and the "
               "data-parallel gradient reduction run on the GPU, NCCL between processes; "
               "docs/gpu.md)"},
      device, one_of({"cpu", "cuda"}));
    v({.name = "tf32",
       .help = "With --device cuda: matmuls in TensorFloat-32 (fp32 storage, 10-bit mantissa "
               "products); default off, exact fp32"},
      tf32);
  }
};

// The loop: the data, the batch each rank trains, how long, validation.
struct LoopOptions {
  std::string data;
  int64_t batch = 4;
  int64_t seq = 0;
  int64_t accum = 1;
  int64_t steps = 100;
  uint64_t seed = 1234;
  double val_fraction = 0.05;
  int64_t val_every = 0;
  int64_t val_batches = 8;
  int threads = 0;
  double memory_limit_gib = 0;
  template <class V>
  void describe(V& v) {
    v({.name = "data",
       .help = "Token file (anvil data tokenize), a weighted mixture of token files "
               "(A.tok:0.7,B.tok:0.3), or raw text (byte tokenizer); omitted: random tokens, "
               "for throughput only"},
      data);
    v({.name = "batch", .help = "Sequences per micro-batch on each rank", .aliases = {"-B"}}, batch,
      at_least<int64_t>(1));
    v({.name = "seq", .help = "Tokens per sequence (0: the config's seq_len)", .aliases = {"-T"}},
      seq, at_least<int64_t>(0));
    v({.name = "accum", .help = "Micro-batches per optimizer step (gradient accumulation)"}, accum,
      at_least<int64_t>(1));
    v({.name = "steps", .help = "Optimizer steps in the whole run"}, steps, at_least<int64_t>(1));
    v({.name = "seed", .help = "Seed for the initial weights and the data order"}, seed);
    v({.name = "val_fraction", .help = "Tail of the data held out for validation"}, val_fraction,
      in_range(0.0, 0.5));
    v({.name = "val_every", .help = "Validate every N steps (0: only at the end)"}, val_every,
      at_least<int64_t>(0));
    v({.name = "val_batches", .help = "Validation sequences (rounded up to whole batches)"},
      val_batches, at_least<int64_t>(1));
    v({.name = "threads",
       .help = "Compute threads per rank (0: OMP_NUM_THREADS, else the node's cores split over "
               "its ranks)"},
      threads, at_least(0));
    v({.name = "memory_limit_gib",
       .help = "Refuse, before any work, a run whose memory plan per rank exceeds N GiB "
               "(0: no limit); a long sequence fits under it with --cp"},
      memory_limit_gib, at_least(0.0));
  }
};

// Checkpoints: where, how often, how many, and where a run resumes from.
struct CheckpointOptions {
  std::string out;
  int64_t every = 0;
  int keep = 3;
  std::string resume;
  bool resume_new_accum = false;
  bool sync_save = false;
  std::string on_save_error = "stop";
  bool resume_new_phase = false;  // set by recipes: the checkpoint ends an earlier phase
  template <class V>
  void describe(V& v) {
    v({.name = "out",
       .help = "Run directory: checkpoints (step-*), metrics.jsonl and train.json (these "
               "options, to repeat the run with --train)"},
      out, output_dir_check());
    v({.name = "every",
       .help = "Checkpoint every N steps (0: only at the end)",
       .flag = "ckpt-every"},
      every, at_least<int64_t>(0));
    v({.name = "keep", .help = "Checkpoints kept, the newest (0: all)"}, keep, at_least(0));
    v({.name = "resume",
       .help = "Continue from a checkpoint, a run directory, or 'latest' (the newest intact "
               "checkpoint in --out)"},
      resume);
    v({.name = "resume_new_accum",
       .help = "With --resume: accept an --accum other than the checkpoint's (a global-batch "
               "ramp; the data draws follow the new accum, so the run leaves the checkpoint's "
               "exact trajectory)"},
      resume_new_accum);
    v({.name = "sync_save",
       .help = "Write each checkpoint before going on (default: a background thread writes it "
               "during the next step's forward and backward; that step's update waits for it)"},
      sync_save);
    v({.name = "on_save_error",
       .help = "When a checkpoint cannot be written (a full disk is first pruned down to the "
               "newest intact checkpoint and the save tried once more): stop (exit 1) or "
               "continue (warn, train on, save again at the next interval; the newest intact "
               "checkpoint is never deleted, and the final save must succeed)"},
      on_save_error, one_of({"stop", "continue"}));
    v({.name = "resume_new_phase",
       .help = "The checkpoint ends an earlier recipe phase",
       .cli = false},
      resume_new_phase);
  }
};

// What a run reports: progress lines, metrics.jsonl, TensorBoard, MFU.
struct MetricsOptions {
  int64_t log_every = 10;
  std::string tensorboard;
  double peak_gflops = 0;
  std::string hw_profile;
  std::string json_out;
  bool quiet = false;
  template <class V>
  void describe(V& v) {
    v({.name = "log_every", .help = "A progress line every N steps when not on a terminal"},
      log_every, at_least<int64_t>(1));
    v({.name = "tensorboard",
       .help = "Also write the step scalars (loss, lr, grad norm, tokens/s, MFU, validation "
               "loss, ZAYA1 router load and skip rate) as TensorBoard event files in DIR"},
      tensorboard, output_dir_check());
    v({.name = "peak_gflops",
       .help = "GEMM peak for MFU (0: --hw-profile's measured peak, else a >= 1 s measurement "
               "cached per machine)"},
      peak_gflops, at_least(0.0));
    v({.name = "hw_profile",
       .help = "Hardware profile (anvil hw --profile) whose measured GEMM peak MFU is against"},
      hw_profile);
    v({.name = "json_out", .help = "Write a JSON summary (losses, tokens/s, MFU, RSS)"}, json_out,
      output_file_check());
    v({.name = "quiet", .help = "Print nothing (library use and tests)", .cli = false}, quiet);
  }
};

// Where a run stands in a recipe (set by recipes; metrics and state.json).
struct PhaseOptions {
  std::string name;
  int64_t first_step = 0;
  int64_t tokens_before = 0;
  template <class V>
  void describe(V& v) {
    v({.name = "name", .help = "The recipe phase", .cli = false}, name);
    v({.name = "first_step", .help = "The phase's first step", .cli = false}, first_step);
    v({.name = "tokens_before", .help = "Tokens trained before the phase", .cli = false},
      tokens_before);
  }
};

struct TrainOptions {
  ModelOptions model;
  LoopOptions train;
  optim::OptimizerOptions optimizer;
  model::Balancing balancing;
  parallel::ParallelOptions parallel;
  CheckpointOptions checkpoint;
  MetricsOptions metrics;
  ft::GuardOptions guard;
  ft::InjectOptions faults;
  PhaseOptions phase;

  // Every option of every section, in order: visit(info, field, check).
  template <class Visit>
  void walk(Visit&& visit) {
    walk_section(model, "model", visit);
    walk_section(train, "train", visit);
    walk_section(optimizer, "optimizer", visit);
    walk_section(balancing, "balancing", visit);
    walk_section(parallel, "parallel", visit);
    walk_section(checkpoint, "checkpoint", visit);
    walk_section(metrics, "metrics", visit);
    walk_section(guard, "guard", visit);
    walk_section(faults, "faults", visit);
    walk_section(phase, "phase", visit);
  }

  // Runs every option's check, then the rules between options; InputError
  // naming the key. Fills in what follows from the rest (the schedule's
  // length, the canonical dtype name).
  void finish();
  // The options as JSON ({"section": {"name": value}}), and back: unknown
  // keys and wrong types are InputErrors naming `origin`.
  nlohmann::json to_json() const;
  void update_from_json(const nlohmann::json& j, const std::string& origin);
};

// A run file (`anvil train --train FILE`): the options of `file` over the
// defaults.
TrainOptions load_train_options(const std::string& file);

// What a run directory records (train.json), so that `anvil train --train
// RUN/train.json` repeats the run: paths made absolute, and without where it
// resumed from or an injected fault.
TrainOptions repeatable(const TrainOptions& options);

}  // namespace anvil::train
