// The optimizer's options: which optimizer, its learning-rate schedule, the
// AdamW and Muon settings and the gradient clip (base/options.hpp).
#pragma once

#include <string>

#include "anvil/base/options.hpp"
#include "anvil/optim/adamw.hpp"
#include "anvil/optim/muon.hpp"

namespace anvil::optim {

template <class T>
Check<T> above(T lo) {
  return [lo](const T& v) { return v > lo ? "" : "must be > " + option_text(lo); };
}

struct OptimizerOptions {
  OptimizerOptions() { schedule.total = 0; }  // 0: as many steps as the run
  std::string name = "adamw";                 // adamw | muon (block matrices; AdamW for the rest)
  Schedule schedule;
  AdamWConfig adamw;
  MuonConfig muon;
  double clip = 1.0;  // 0: off
  template <class V>
  void describe(V& v) {
    v({.name = "name",
       .help = "adamw, or muon: Muon (Newton-Schulz, RMS-matched to AdamW, one --lr) for the "
               "blocks' weight matrices and AdamW for embeddings, LM head, norms and biases",
       .flag = "optimizer"},
      name, one_of({"adamw", "muon"}));
    v({.name = "lr", .help = "Peak learning rate"}, schedule.lr, at_least(0.0));
    v({.name = "schedule", .help = "Learning-rate schedule: cosine, wsd or constant"},
      schedule.kind, one_of({"cosine", "wsd", "constant"}));
    v({.name = "warmup", .help = "Linear warmup steps"}, schedule.warmup, at_least<int64_t>(0));
    v({.name = "min_lr_ratio", .help = "Final lr as a fraction of --lr"}, schedule.min_lr_ratio,
      in_range(0.0, 1.0));
    v({.name = "decay_fraction", .help = "WSD: the fraction of steps at the end that decays"},
      schedule.decay_fraction, in_range(0.0, 1.0));
    v({.name = "schedule_total",
       .help = "Steps the schedule spans (0: the run's steps)",
       .cli = false},
      schedule.total, at_least<int64_t>(0));
    v({.name = "schedule_start", .help = "The step the schedule begins at", .cli = false},
      schedule.start, at_least<int64_t>(0));
    v({.name = "weight_decay",
       .help = "Decoupled weight decay, AdamW's and (with --optimizer muon) Muon's"},
      adamw.weight_decay, at_least(0.0f));
    v({.name = "beta1", .help = "AdamW beta1"}, adamw.beta1, in_range(0.0f, 1.0f));
    v({.name = "beta2", .help = "AdamW beta2"}, adamw.beta2, in_range(0.0f, 1.0f));
    v({.name = "clip", .help = "Global gradient-norm clip (0: off)"}, clip, at_least(0.0));
    v({.name = "muon_momentum", .help = "Muon momentum (Nesterov)"}, muon.momentum,
      in_range(0.0f, 1.0f));
    v({.name = "muon_bf16",
       .help = "Muon: Newton-Schulz GEMMs with bf16 inputs and fp32 accumulation (as the "
               "reference Muon), instead of fp32"},
      muon.ns_bf16);
  }
};

}  // namespace anvil::optim
