// The GEMM interface the layers are written against, on any device:
//   C[m,n] = epilogue(alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n] (+ bias[n]))
// row-major, as gemm.hpp. Backends: the CPU's (OpenBLAS / oneDNN through
// device::gemm, epilogues applied by a loop over epilogue.hpp's bodies) and
// CUDA's cuBLASLt (the algorithm chosen by its heuristic with a workspace,
// cached per shape; epilogues fused).
//
// Types: the inputs' type names the multiply; the output is fp32, or with
// out_f32 false the input's own 16-bit type (bf16 for fp8 inputs):
//   fp32  fp32 x fp32, fp32 accumulate          (CPU, CUDA)
//   tf32  fp32 storage, TensorFloat-32 multiply (CUDA)
//   bf16  bf16 x bf16, fp32 accumulate          (CPU: fp32 out only; CUDA)
//   fp16  fp16 x fp16, fp32 accumulate          (CUDA)
//   fp8   e4m3 x e4m3, fp32 accumulate, unit scales; A B^T only (trans_b, not
//         trans_a), the layout tensor cores take (CUDA, compute capability 8.9+)
// The bias has the output's type; so has the aux matrix of bias_gelu_aux and
// dgelu (epilogue.hpp), which has the output's shape and row stride and takes
// no batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "anvil/base/dtype.hpp"
#include "anvil/device/epilogue.hpp"
#include "anvil/device/gemm.hpp"
#include "anvil/device/runtime.hpp"

namespace anvil::device {

struct GemmDesc {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: the packed stride
  Dtype type = Dtype::fp32;
  bool out_f32 = true;
  Epilogue epilogue = Epilogue::none;
  float alpha = 1.0f, beta = 0.0f;
  // Strided batch: `batch` GEMMs of this shape, the i-th at a + i stride_a,
  // b + i stride_b, c + i stride_c (elements), one launch on cuBLASLt.
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;

  // The strides with the packed ones filled in.
  int64_t a_stride() const { return lda ? lda : (trans_a ? m : k); }
  int64_t b_stride() const { return ldb ? ldb : (trans_b ? k : n); }
  int64_t c_stride() const { return ldc ? ldc : n; }
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
  // The output's element type.
  Dtype out_type() const;
  std::string describe() const;  // "bf16 NT 4096x4096x4096 -> bf16 +bias"
};

// Host values in a GEMM type's encoding (fp32/tf32 as they are, bf16 rounded
// to nearest even, fp16 and fp8 e4m3 by the CUDA headers' host conversions),
// and back to float. fp16 and fp8 need a CUDA build (SystemError otherwise).
std::vector<unsigned char> encode(const std::vector<float>& values, Dtype type);
std::vector<float> decode(const std::vector<unsigned char>& bytes, Dtype type);

class GemmEngine {
 public:
  virtual ~GemmEngine() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (openblas/onednn)", "cuBLASLt 13.1.0"
  // Empty when the engine runs `desc`; otherwise why not.
  virtual std::string unsupported(const GemmDesc& desc) const = 0;
  // How many algorithms the backend proposes for `desc`, best first (at most
  // `max`; cuBLASLt's heuristic): run(..., algo) takes 0..count-1.
  virtual int candidates(const GemmDesc& desc, int max) = 0;
  // Queues the GEMM on `stream`. `algo` -1: the backend's own choice (the
  // heuristic's first, cached per shape). `aux`: the aux matrix of an epilogue
  // that uses one (written by bias_gelu_aux, read by dgelu). Throws InputError
  // for an unsupported desc, SystemError when the backend fails.
  virtual void run(const GemmDesc& desc, const void* a, const void* b, void* c, const void* bias,
                   Stream& stream, int algo = -1, void* aux = nullptr) = 0;
};

// Throws InputError naming what `d`'s epilogue needs and did not get (a bias,
// an aux matrix); every engine's run() starts with it.
void check_operands(const GemmDesc& d, const void* bias, const void* aux);

// The engine of a device kind; the CPU engine uses `cpu_backend` (gemm.hpp).
// Throws SystemError for cuda where no device can be used.
std::unique_ptr<GemmEngine> make_gemm_engine(DeviceKind kind,
                                             GemmBackend cpu_backend = GemmBackend::automatic);

}  // namespace anvil::device
