// `anvil plot`: PNG charts of a training run (RUN/metrics.jsonl) and of
// benchmark JSON (anvil bench comm / gemm --json), drawn by gnuplot
// (Debian's gnuplot-nox, pngcairo terminal): anvil writes the data columns
// and the gnuplot script, gnuplot renders. Each PNG is written under a
// temporary name and renamed into place.
//
// A run gives:
//   loss.png        training loss and validation loss against tokens, one
//                   shade per recipe phase
//   lr.png          the learning rate against step
//   throughput.png  tokens/s and MFU against step
//   router.png      ZAYA1 only: per MoE layer, expert load max/min and the
//                   skip rate against step
// A bench file gives:
//   comm-<op>.png   bus bandwidth against message size, one line per
//                   algorithm (log-log)
//   gemm.png        GFLOP/s against the GEMM's FLOPs, one line per dtype
#pragma once

#include <string>
#include <vector>

namespace anvil::eval {

// Throws InputError naming the file for a missing or malformed input, and
// SystemError when gnuplot is missing or fails. Returns the PNGs written.
std::vector<std::string> plot_run(const std::string& run_dir, const std::string& out_dir);
std::vector<std::string> plot_bench(const std::string& bench_json, const std::string& out_dir);

}  // namespace anvil::eval
