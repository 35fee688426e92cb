#include "anvil/device/blas.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "anvil/base/error.hpp"

namespace anvil::device {
namespace {

// CBLAS enum values (cblas.h); declared here because the library is dlopen()ed.
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;
constexpr int kLower = 122;

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
using SsyrkFn = void (*)(int, int, int, int, int, float, const float*, int, float, float*, int);
using StringFn = char* (*)();

struct Blas {
  BlasInfo info;
  SgemmFn sgemm = nullptr;
  SsyrkFn ssyrk = nullptr;  // optional
};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

Blas load() {
  Blas blas;
  BlasInfo& info = blas.info;
  info.inherited = env_or_empty("OPENBLAS_CORETYPE");
  std::string policy = env_or_empty("ANVIL_BLAS_CORETYPE");
  if (policy.empty()) policy = "auto";

  if (policy == "auto") {
    info.policy = "auto";
    info.requested = choose_openblas_coretype(cpu_info().features);
    if (info.requested.empty()) {
      ::unsetenv("OPENBLAS_CORETYPE");
      info.reason = "no AVX2/AVX-512 found; the library's own detection is kept";
    } else {
      ::setenv("OPENBLAS_CORETYPE", info.requested.c_str(), 1);
      info.reason = "chosen by anvil from CPUID (" +
                    std::string(cpu_info().features.avx512_skylakex() ? "AVX-512" : "AVX2/FMA") +
                    ")";
      if (!info.inherited.empty() && info.inherited != info.requested) {
        info.reason += "; replaced inherited OPENBLAS_CORETYPE=" + info.inherited;
      }
    }
  } else if (policy == "library") {
    info.policy = "library";
    ::unsetenv("OPENBLAS_CORETYPE");
    info.reason = "ANVIL_BLAS_CORETYPE=library: the library's own CPU detection";
  } else if (policy == "env") {
    info.policy = "env";
    info.requested = info.inherited;
    info.reason = info.inherited.empty()
                      ? "ANVIL_BLAS_CORETYPE=env and no OPENBLAS_CORETYPE: library detection"
                      : "ANVIL_BLAS_CORETYPE=env: OPENBLAS_CORETYPE as inherited";
  } else {
    info.policy = "explicit";
    info.requested = policy;
    ::setenv("OPENBLAS_CORETYPE", policy.c_str(), 1);
    info.reason = "ANVIL_BLAS_CORETYPE=" + policy;
  }

  // The OpenMP build first: it shares one thread pool with anvil's kernels
  // and oneDNN, where the pthreads build would spin its own threads against them.
  std::vector<std::string> candidates;
  const std::string forced = env_or_empty("ANVIL_BLAS_LIBRARY");
  if (!forced.empty()) {
    candidates = {forced};
  } else {
    candidates = {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                  "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0",
                  "libopenblas.so.0"};
  }
  void* handle = nullptr;
  std::string path, errors;
  for (const auto& c : candidates) {
    handle = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      path = c;
      break;
    }
    errors += std::string(errors.empty() ? "" : "; ") + ::dlerror();
  }
  if (!handle) {
    throw SystemError("cannot load OpenBLAS (" + errors +
                      "); install libopenblas0-openmp or set ANVIL_BLAS_LIBRARY");
  }
  blas.sgemm = reinterpret_cast<SgemmFn>(::dlsym(handle, "cblas_sgemm"));
  blas.ssyrk = reinterpret_cast<SsyrkFn>(::dlsym(handle, "cblas_ssyrk"));
  auto get_config = reinterpret_cast<StringFn>(::dlsym(handle, "openblas_get_config"));
  auto get_corename = reinterpret_cast<StringFn>(::dlsym(handle, "openblas_get_corename"));
  if (!blas.sgemm) throw SystemError("BLAS library '" + path + "' has no cblas_sgemm");
  info.config = get_config ? get_config() : "unknown (not OpenBLAS)";
  info.corename = get_corename ? get_corename() : "unknown";
  Dl_info where{};
  if (::dladdr(reinterpret_cast<void*>(blas.sgemm), &where) && where.dli_fname) {
    std::error_code ec;
    const auto real = std::filesystem::canonical(where.dli_fname, ec);
    info.library = ec ? where.dli_fname : real.string();
  } else {
    info.library = path;
  }
  return blas;
}

const Blas& blas() {
  static const Blas instance = load();
  return instance;
}

}  // namespace

std::string choose_openblas_coretype(const CpuFeatures& f) {
  // Cooperlake = SkylakeX kernels plus the AVX512_BF16 ones; same sgemm.
  if (f.avx512_skylakex() && f.avx512_bf16) return "Cooperlake";
  if (f.avx512_skylakex()) return "SkylakeX";
  if (f.avx2 && f.fma) return "Haswell";
  return "";
}

const BlasInfo& blas_info() {
  return blas().info;
}

void blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  blas().sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans,
               static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
               static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

bool blas_ssyrk_lower(int64_t n, int64_t k, float alpha, const float* a, int64_t lda, float beta,
                      float* c, int64_t ldc) {
  if (!blas().ssyrk) return false;
  blas().ssyrk(kRowMajor, kLower, kNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, a,
               static_cast<int>(lda), beta, c, static_cast<int>(ldc));
  return true;
}

}  // namespace anvil::device
