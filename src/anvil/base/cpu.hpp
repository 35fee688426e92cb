// What the CPU is and can do: model, cores, ISA features, caches, memory.
// Read once from CPUID, sysconf and /proc; used by `anvil hw`, by the BLAS
// loader (to pick OpenBLAS's core type) and by the hardware profile.
#pragma once

#include <cstdint>
#include <string>

namespace anvil {

struct CpuFeatures {
  bool sse4_2 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;

  // AVX-512 as OpenBLAS's SkylakeX kernels need it.
  bool avx512_skylakex() const { return avx512f && avx512bw && avx512dq && avx512vl; }
};

struct CpuInfo {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD"
  std::string model_name;  // brand string
  int family = 0;          // display family (base + extended)
  int model = 0;           // display model (base + extended << 4)
  int stepping = 0;
  int logical_cpus = 0;    // online logical CPUs
  int physical_cores = 0;  // best effort: logical / threads-per-core
  CpuFeatures features;
  int64_t l1d_bytes = 0;
  int64_t l2_bytes = 0;
  int64_t l3_bytes = 0;
  int64_t memory_bytes = 0;  // MemTotal
  // "avx2" when ANVIL_ISA=avx2 masked the features to an AVX2-only CPU's
  // (AVX-512 and AMX cleared), so every run-time choice that reads them
  // (OpenBLAS's core type, oneDNN's kernels, the bf16 engine, the bf16 tile
  // kernel) takes the path such a CPU takes; empty otherwise.
  std::string isa_limit;
};

// Reads the CPU once; cheap to call again (cached). ANVIL_ISA=auto (the
// default) or avx2; another value is an InputError.
const CpuInfo& cpu_info();

}  // namespace anvil
