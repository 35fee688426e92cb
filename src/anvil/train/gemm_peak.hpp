// The GEMM rate a run's MFU is measured against. In order: a rate given
// (--peak-gflops), the measured peak of a hardware profile (--hw-profile) at
// this rank's thread count, or a measurement of 2048^3 GEMMs timed for at
// least one second (the median call, as `anvil bench gemm` reports it),
// cached per machine kind, dtype and thread count so later runs reuse it.
#pragma once

#include <string>

#include "anvil/model/precision.hpp"

namespace anvil::train {

struct GemmPeak {
  double gflops = 0;
  std::string source;  // said beside the MFU: where the rate comes from
};

// `given` > 0 wins; `hw_profile` a file or "" (the cache, measuring on a
// miss). The cache lives in $ANVIL_CACHE_DIR, else $XDG_CACHE_HOME/anvil,
// else ~/.cache/anvil (gemm-peak.json); a cache that cannot be written is
// only not kept.
GemmPeak gemm_peak(double given, const std::string& hw_profile, model::Precision precision);

// Median GFLOP/s of n^3 GEMMs in `precision` timed for `min_seconds`.
double measure_gemm_gflops(model::Precision precision, int64_t n, double min_seconds);

}  // namespace anvil::train
