// The GEMM rate a run's MFU is measured against. In order: a rate given
// (--peak-gflops), the measured peak of a hardware profile (--hw-profile) at
// this rank's thread count, or a measurement of 2048^3 GEMMs timed for at
// least one second (the median call, as `anvil bench gemm` reports it),
// cached per machine kind, dtype and thread count so later runs reuse it.
// A measurement is cached only when the machine looked idle (1-minute load
// under half its CPUs, calls within 10% of the fastest), and a cached rate
// that a run beats by more than 5% is dropped, so a busy moment does not
// skew every later run.
#pragma once

#include <string>

#include "anvil/base/dtype.hpp"
#include "anvil/device/runtime.hpp"
#include "anvil/model/precision.hpp"

namespace anvil::train {

struct GemmPeak {
  double gflops = 0;
  std::string source;   // said beside the MFU: where the rate comes from
  bool cached = false;  // read from the cache
};

// `given` > 0 wins; `hw_profile` a file or "" (the cache, measuring on a
// miss). The cache lives in $ANVIL_CACHE_DIR, else $XDG_CACHE_HOME/anvil,
// else ~/.cache/anvil (gemm-peak.json); a cache that cannot be written is
// only not kept.
GemmPeak gemm_peak(double given, const std::string& hw_profile, model::Precision precision);

// On a GPU (--device cuda): `given` > 0 wins; else 4096^3 GEMMs of `type`
// (the run's: bf16, or fp32 / tf32) on the device's GEMM engine, timed with events: the median
// of 20 calls after 3 unmeasured ones. Not cached (it takes well under a
// second).
GemmPeak device_gemm_peak(double given, device::DeviceKind kind, Dtype type);

// Drops the cached rate of `precision` here (a run went faster than it).
void forget_cached_peak(model::Precision precision);
// The cache's key for `precision` on this machine and thread count.
std::string gemm_peak_cache_key(model::Precision precision);

}  // namespace anvil::train
