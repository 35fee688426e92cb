// General matrix multiply, row-major, as BLAS defines it:
//   C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
// op(X) is X or X^T; lda/ldb/ldc are row strides in elements. With beta == 0
// C is not read (it may hold NaN). fp32 runs on OpenBLAS (with the core type
// fixed, see blas.hpp) or, for mid-sized shapes where it measured faster, on
// oneDNN; the choice depends on the shape only, so results are deterministic.
// bf16 inputs with fp32 accumulation and output take one of two paths, chosen
// once per process (bf16_path()): oneDNN's AVX512_BF16 kernels (~2x fp32 where
// the CPU has them), or, on every other x86-64, the inputs widened to fp32
// (exact) and the fp32 GEMM. Both multiply the same bf16 values and accumulate
// in fp32; only the summation order differs.
#pragma once

#include <cstdint>
#include <string>

#include "anvil/base/bf16.hpp"

namespace anvil::device {

enum class GemmBackend {
  automatic,  // the fastest measured here: see prefer_onednn_f32; oneDNN for bf16
  openblas,   // fp32; bf16: inputs widened to fp32 in bounded blocks, then OpenBLAS (shapes
              // that change every call, where oneDNN would build a primitive each)
  onednn,     // fp32 and bf16
  reference,  // naive triple loop with double accumulation: the test oracle
  emulated,   // bf16: inputs widened to fp32 in bounded blocks, then `automatic`; fp32: automatic
  segments,   // the token dimension (m; k when A is transposed) changes every call, as in MoE
              // expert segments: fp32 on OpenBLAS; bf16 on oneDNN with that dimension left to
              // run time (one primitive for every row count) where bf16 is native, else openblas
};

enum class Bf16Path { native, emulated };

// The bf16 path of the automatic backend, chosen on first use: native where
// the CPU has AVX512_BF16, else emulated; ANVIL_BF16=auto|native|emulated
// overrides (emulated forces the fallback on any CPU, as CI does). Throws
// InputError for another value, or for native on a CPU without AVX512_BF16.
Bf16Path bf16_path();
// "native AMX tiles (oneDNN avx512_core_amx)", "native AVX512_BF16 (oneDNN)" or
// "emulated (bf16 widened to fp32, fp32 GEMM)".
std::string bf16_path_description(Bf16Path path);
// True where the CPU can run the native path (the onednn backend for bf16).
bool bf16_native_available();
// oneDNN's effective CPU ISA ("avx2", "avx512_core_bf16", "avx512_core_amx",
// ...), held to AVX2 where cpu_info().isa_limit says so (set before oneDNN
// creates anything).
std::string onednn_cpu_isa();

std::string to_string(GemmBackend backend);

// The automatic backend's fp32 rule: true where oneDNN measured faster.
bool prefer_onednn_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k);
// Throws InputError naming `flag` for an unknown name.
GemmBackend parse_gemm_backend(const std::string& name, const std::string& flag);

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend = GemmBackend::automatic);

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
          int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc,
          GemmBackend backend = GemmBackend::automatic);

namespace detail {
// The emulated bf16 GEMM with a chosen bound on each widened block (floats):
// gemm(..., GemmBackend::emulated) uses 4M; tests use small bounds to run the
// blocked loops on small shapes.
// `inner` runs the widened blocks' fp32 GEMMs.
void gemm_bf16_emulated(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta,
                        float* c, int64_t ldc, int64_t block_elems,
                        GemmBackend inner = GemmBackend::automatic);
}  // namespace detail

}  // namespace anvil::device
