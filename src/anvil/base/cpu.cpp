#include "anvil/base/cpu.hpp"

#include "anvil/base/env_choice.hpp"

#include <cpuid.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace anvil {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(unsigned reg, int n) {
  return (reg >> n) & 1u;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

int64_t meminfo_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

// Threads per core from /proc/cpuinfo ("siblings" / "cpu cores"); 1 if unknown.
int threads_per_core() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  int siblings = 0, cores = 0;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    if (key == "siblings" && siblings == 0) siblings = std::atoi(line.c_str() + colon + 1);
    if (key == "cpu cores" && cores == 0) cores = std::atoi(line.c_str() + colon + 1);
  }
  return (siblings > 0 && cores > 0 && siblings >= cores) ? siblings / cores : 1;
}

CpuInfo read_cpu_info() {
  CpuInfo info;
  const Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  info.vendor = vendor;
  const unsigned max_leaf = v.a;

  const Regs l1 = cpuid(1);
  const int base_family = (l1.a >> 8) & 0xf;
  const int ext_family = (l1.a >> 20) & 0xff;
  const int base_model = (l1.a >> 4) & 0xf;
  const int ext_model = (l1.a >> 16) & 0xf;
  info.family = base_family == 0xf ? base_family + ext_family : base_family;
  info.model =
      (base_family == 0x6 || base_family == 0xf) ? (ext_model << 4) + base_model : base_model;
  info.stepping = l1.a & 0xf;

  CpuFeatures& f = info.features;
  f.sse4_2 = bit(l1.c, 20);
  f.fma = bit(l1.c, 12);
  const bool osxsave = bit(l1.c, 27);
  f.avx = bit(l1.c, 28) && osxsave;
  // The OS must also save the wide registers (XCR0), or the ISA is unusable.
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  f.avx = f.avx && os_avx;
  f.fma = f.fma && os_avx;
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.b, 5) && os_avx;
    f.avx512f = bit(l7.b, 16) && os_avx512;
    f.avx512dq = bit(l7.b, 17) && os_avx512;
    f.avx512bw = bit(l7.b, 30) && os_avx512;
    f.avx512vl = bit(l7.b, 31) && os_avx512;
    f.avx512_vnni = bit(l7.c, 11) && os_avx512;
    f.avx512_fp16 = bit(l7.d, 23) && os_avx512;
    f.amx_bf16 = bit(l7.d, 22) && os_amx;
    f.amx_tile = bit(l7.d, 24) && os_amx;
    f.amx_int8 = bit(l7.d, 25) && os_amx;
    if (l7.a >= 1) {
      const Regs l71 = cpuid(7, 1);
      f.avx512_bf16 = bit(l71.a, 5) && os_avx512;
    }
  }

  const Regs ext = cpuid(0x80000000);
  if (ext.a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    info.model_name = trim(brand);
  }

  info.logical_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (info.logical_cpus <= 0)
    info.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  info.physical_cores = std::max(1, info.logical_cpus / threads_per_core());
  // glibc reads the cache sizes from CPUID for both Intel and AMD.
  info.l1d_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  info.l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  info.l3_bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  info.memory_bytes = meminfo_total_bytes();
  if (env_choice("ANVIL_ISA", {"auto", "avx2"}) == "avx2") {
    info.isa_limit = "avx2";
    CpuFeatures& f = info.features;
    f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = false;
    f.avx512_vnni = f.avx512_bf16 = f.avx512_fp16 = false;
    f.amx_tile = f.amx_bf16 = f.amx_int8 = false;
  }
  return info;
}

}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = read_cpu_info();
  return info;
}

}  // namespace anvil
