// The CUDA GEMM engine on cuBLASLt. Row-major C = op(A) op(B) is computed as
// the column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B, its B our A,
// and m and n swap; the bias then runs along cuBLASLt's rows, which are our
// output columns, as the layers want. Per shape (and pointer alignment) the
// matmul descriptor, the layouts and the heuristic's ranked algorithms are
// built once and cached; a 32 MiB workspace is allocated once.
// The GPU machine's own cuBLASLt runs (libcublasLt.so.13, through dlopen).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/device/cuda_backend.hpp"
#include "anvil/device/cuda_check.hpp"
#include "anvil/device/dynamic_library.hpp"
#include "anvil/device/gemm_engine.hpp"

namespace anvil::device::cuda {
namespace {

// cuBLASLt is loaded when the first GEMM engine is made (dlopen), not at
// start: a 500 MB library that every CPU-only run would otherwise map.
struct Lt {
  std::string error;  // why it could not be loaded; empty when loaded
#define ANVIL_LT_FN(name) decltype(&::name) name = nullptr;
  ANVIL_LT_FN(cublasLtCreate)
  ANVIL_LT_FN(cublasLtDestroy)
  ANVIL_LT_FN(cublasLtGetVersion)
  ANVIL_LT_FN(cublasLtMatmul)
  ANVIL_LT_FN(cublasLtMatmulAlgoGetHeuristic)
  ANVIL_LT_FN(cublasLtMatmulDescCreate)
  ANVIL_LT_FN(cublasLtMatmulDescDestroy)
  ANVIL_LT_FN(cublasLtMatmulDescSetAttribute)
  ANVIL_LT_FN(cublasLtMatmulPreferenceCreate)
  ANVIL_LT_FN(cublasLtMatmulPreferenceDestroy)
  ANVIL_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  ANVIL_LT_FN(cublasLtMatrixLayoutCreate)
  ANVIL_LT_FN(cublasLtMatrixLayoutDestroy)
  ANVIL_LT_FN(cublasLtMatrixLayoutSetAttribute)
#undef ANVIL_LT_FN
};

const Lt& loaded_lt() {
  static Lt l;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* lib_name = "libcublasLt.so.13";
    void* lib = open_library(lib_name, l.error);
    if (!lib) return;
#define ANVIL_LT_BIND(name) bind_symbol(lib, lib_name, #name, l.name, l.error);
    ANVIL_LT_BIND(cublasLtCreate)
    ANVIL_LT_BIND(cublasLtDestroy)
    ANVIL_LT_BIND(cublasLtGetVersion)
    ANVIL_LT_BIND(cublasLtMatmul)
    ANVIL_LT_BIND(cublasLtMatmulAlgoGetHeuristic)
    ANVIL_LT_BIND(cublasLtMatmulDescCreate)
    ANVIL_LT_BIND(cublasLtMatmulDescDestroy)
    ANVIL_LT_BIND(cublasLtMatmulDescSetAttribute)
    ANVIL_LT_BIND(cublasLtMatmulPreferenceCreate)
    ANVIL_LT_BIND(cublasLtMatmulPreferenceDestroy)
    ANVIL_LT_BIND(cublasLtMatmulPreferenceSetAttribute)
    ANVIL_LT_BIND(cublasLtMatrixLayoutCreate)
    ANVIL_LT_BIND(cublasLtMatrixLayoutDestroy)
    ANVIL_LT_BIND(cublasLtMatrixLayoutSetAttribute)
#undef ANVIL_LT_BIND
  });
  return l;
}

const Lt& lt() {
  const Lt& l = loaded_lt();
  if (!l.error.empty()) throw SystemError("cuBLASLt: " + l.error);
  return l;
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw SystemError(std::string(what) + " failed: cuBLAS status " +
                    std::to_string(static_cast<int>(s)));
}

cudaDataType_t cuda_type(Dtype t) {
  switch (t) {
    case Dtype::fp32:
    case Dtype::tf32:
      return CUDA_R_32F;
    case Dtype::bf16:
      return CUDA_R_16BF;
    case Dtype::fp16:
      return CUDA_R_16F;
    case Dtype::fp8:
      return CUDA_R_8F_E4M3;
    default:
      throw InputError("gemm: cuBLASLt has no " + anvil::to_string(t) + " path");
  }
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu:
      return CUBLASLT_EPILOGUE_GELU;
    case Epilogue::bias_gelu:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::bias_gelu_aux:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two (up to 256) that divides every address.
uint32_t alignment(std::initializer_list<const void*> ptrs) {
  uintptr_t bits = 256;
  for (const void* p : ptrs)
    if (p) bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  int asked = 0;     // the most algorithms asked of the heuristic so far
  bool aux = false;  // an aux epilogue: refused shapes run unfused
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) lt().cublasLtMatrixLayoutDestroy(a);
    if (b) lt().cublasLtMatrixLayoutDestroy(b);
    if (c) lt().cublasLtMatrixLayoutDestroy(c);
    if (op) lt().cublasLtMatmulDescDestroy(op);
  }
};

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool,
                       int, uint32_t, int64_t, int64_t, int64_t, int64_t>;

class CublasLtEngine final : public GemmEngine {
 public:
  CublasLtEngine() {
    // The device first: a constructor that throws after cublasLtCreate
    // would leave the handle behind (no destructor runs).
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    cc_ = p.major * 10 + p.minor;
    check_lt(lt().cublasLtCreate(&handle_), "cublasLtCreate");
  }
  ~CublasLtEngine() override {
    plans_.clear();
    if (workspace_) cudaFree(workspace_);
    lt().cublasLtDestroy(handle_);
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override {
    const int v = cublaslt_version();
    return "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100);
  }

  std::string unsupported(const GemmDesc& d) const override {
    if (d.batch < 1 || d.batch > INT32_MAX) return "expected a batch of 1 to 2^31 - 1";
    if (uses_aux(d.epilogue) && (d.batch != 1 || d.out_type() != Dtype::fp32))
      return "the aux epilogues take no batch and write fp32";
    switch (d.type) {
      case Dtype::fp32:
      case Dtype::tf32:
      case Dtype::bf16:
      case Dtype::fp16:
        return "";
      case Dtype::fp8:
        if (cc_ < 89) return "fp8 needs compute capability 8.9 or later, this GPU has " +
                             std::to_string(cc_ / 10) + "." + std::to_string(cc_ % 10);
        if (d.trans_a || !d.trans_b) return "fp8 multiplies A B^T only (trans_b, not trans_a)";
        // cuBLASLt's fp8 kernels with fp32 output read a bf16 bias, not one
        // of the output's type as every other GEMM here passes.
        if (has_bias(d.epilogue) && d.out_type() == Dtype::fp32)
          return "fp8 with fp32 output takes no bias epilogue here (cuBLASLt reads its bias as "
                 "bf16)";
        return "";
      default:
        return "cuBLASLt has no " + anvil::to_string(d.type) + " GEMM";
    }
  }

  int candidates(const GemmDesc& d, int max) override {
    Plan& plan = plan_for(d, 256, std::max(max, 1));
    return std::min<int>(max, static_cast<int>(plan.algos.size()));
  }

  void run(const GemmDesc& d, const void* a, const void* b, void* c, const void* bias,
           Stream& stream, int algo, void* aux) override {
    const std::string why = unsupported(d);
    if (!why.empty()) throw InputError("gemm " + d.describe() + ": " + why);
    check_operands(d, bias, aux);
    // A batch's later matrices are aligned as the base and the stride allow.
    const auto in = static_cast<uintptr_t>(dtype_bytes(d.type));
    const auto out = static_cast<uintptr_t>(dtype_bytes(d.out_type()));
    auto bytes = [](int64_t stride, uintptr_t size) {
      return reinterpret_cast<const void*>(static_cast<uintptr_t>(stride) * size);
    };
    const uint32_t align = alignment(
        {a, b, c, bias, aux, bytes(d.stride_a, in), bytes(d.stride_b, in), bytes(d.stride_c, out)});
    // cuBLASLt takes an aux matrix whose row stride is a multiple of 8 (the
    // batch was refused above); other aux GEMMs, and those it has no
    // algorithm for, run unfused.
    if (uses_aux(d.epilogue) &&
        (d.c_stride() % 8 != 0 || plan_for(d, align, 1, bias, aux).algos.empty())) {
      run_unfused(d, a, b, c, bias, stream, aux);
      return;
    }
    Plan& plan = plan_for(d, align, std::max(algo + 1, 1), bias, aux);
    if (plan.algos.empty()) throw SystemError("cuBLASLt: no algorithm for gemm " + d.describe());
    if (algo >= static_cast<int>(plan.algos.size()))
      throw InputError("gemm " + d.describe() + ": algorithm " + std::to_string(algo) + " of " +
                       std::to_string(plan.algos.size()));
    const auto& chosen = plan.algos[static_cast<size_t>(std::max(algo, 0))];
    const cublasStatus_t status = lt().cublasLtMatmul(
        handle_, plan.op, &d.alpha, b, plan.a, a, plan.b, &d.beta, c, plan.c, c, plan.c,
        &chosen.algo, workspace(), kWorkspaceBytes, static_cast<cudaStream_t>(stream.native()));
    // An aux epilogue cuBLASLt refuses at launch (it checks its arguments
    // before queuing anything) runs unfused, now and for this shape after.
    if (status != CUBLAS_STATUS_SUCCESS && uses_aux(d.epilogue)) {
      plan.algos.clear();
      run_unfused(d, a, b, c, bias, stream, aux);
      return;
    }
    check_lt(status, "cublasLtMatmul");
  }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // The GEMM without its epilogue, then the epilogue's bodies in one kernel.
  void run_unfused(const GemmDesc& d, const void* a, const void* b, void* c, const void* bias,
                   Stream& stream, void* aux) {
    GemmDesc plain = d;
    plain.epilogue = Epilogue::none;
    run(plain, a, b, c, nullptr, stream, -1, nullptr);
    epilogue_in_place(d.epilogue, static_cast<float*>(c), d.m, d.n, d.c_stride(),
                      static_cast<const float*>(bias), static_cast<float*>(aux), stream.native());
  }

  void* workspace() {
    if (!workspace_) workspace_ = allocate(kWorkspaceBytes, "cuBLASLt workspace");
    return workspace_;
  }

  // The plan of a shape, with this call's bias and aux pointers set (the
  // heuristic reads them for their alignment, so they are set before it
  // ranks the algorithms) and at least `want` algorithms asked for.
  Plan& plan_for(const GemmDesc& d, uint32_t align, int want, const void* bias = nullptr,
                 void* aux = nullptr) {
    const Key key{d.trans_a,
                  d.trans_b,
                  d.m,
                  d.n,
                  d.k,
                  d.a_stride(),
                  d.b_stride(),
                  d.c_stride(),
                  static_cast<int>(d.type),
                  d.out_f32,
                  static_cast<int>(d.epilogue),
                  align,
                  d.batch,
                  d.stride_a,
                  d.stride_b,
                  d.stride_c};
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, build(d)).first;
    Plan& plan = *it->second;
    if (has_bias(d.epilogue)) {
      check_lt(lt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof bias),
               "set BIAS_POINTER");
    }
    if (uses_aux(d.epilogue)) {
      check_lt(lt().cublasLtMatmulDescSetAttribute(
                   plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
               "set EPILOGUE_AUX_POINTER");
    }
    if (plan.asked < want) {
      rank_algorithms(plan, align, want);
      plan.asked = want;
    }
    return plan;
  }

  std::unique_ptr<Plan> build(const GemmDesc& d) {
    auto plan = std::make_unique<Plan>();
    const cublasComputeType_t compute =
        d.type == Dtype::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check_lt(lt().cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // cuBLASLt's A is our B, its B our A (see the top of the file).
    const cublasOperation_t op_a = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_lt(lt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                            sizeof op_a),
             "set TRANSA");
    check_lt(lt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                            sizeof op_b),
             "set TRANSB");
    const cublasLtEpilogue_t epi = lt_epilogue(d.epilogue);
    check_lt(lt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                            sizeof epi),
             "set EPILOGUE");
    plan->aux = uses_aux(d.epilogue);
    if (plan->aux) {  // the aux matrix's row stride, C's (the key holds it)
      const int64_t ld = d.c_stride();
      check_lt(lt().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &ld, sizeof ld),
               "set EPILOGUE_AUX_LD");
    }
    const cudaDataType_t in = cuda_type(d.type);
    const cudaDataType_t out = cuda_type(d.out_type());
    const uint64_t m = static_cast<uint64_t>(d.m), n = static_cast<uint64_t>(d.n),
                   k = static_cast<uint64_t>(d.k);
    check_lt(lt().cublasLtMatrixLayoutCreate(&plan->a, in, d.trans_b ? k : n, d.trans_b ? n : k,
                                        d.b_stride()),
             "lt().cublasLtMatrixLayoutCreate(A)");
    check_lt(lt().cublasLtMatrixLayoutCreate(&plan->b, in, d.trans_a ? m : k, d.trans_a ? k : m,
                                        d.a_stride()),
             "lt().cublasLtMatrixLayoutCreate(B)");
    check_lt(lt().cublasLtMatrixLayoutCreate(&plan->c, out, n, m, d.c_stride()),
             "lt().cublasLtMatrixLayoutCreate(C)");
    if (d.batch > 1) {  // strided batch: every layout gets the count and its stride
      const auto count = static_cast<int32_t>(d.batch);
      const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
          {plan->a, d.stride_b}, {plan->b, d.stride_a}, {plan->c, d.stride_c}};
      for (const auto& [layout, stride] : layouts) {
        check_lt(lt().cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count),
                 "set BATCH_COUNT");
        check_lt(lt().cublasLtMatrixLayoutSetAttribute(
                     layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                 "set STRIDED_BATCH_OFFSET");
      }
    }
    return plan;
  }

  void rank_algorithms(Plan& plan, uint32_t align, int want) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(lt().cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = kWorkspaceBytes;
    lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      lt().cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(want));
    int returned = 0;
    const cublasStatus_t s =
        lt().cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, want,
                                       results.data(), &returned);
    lt().cublasLtMatmulPreferenceDestroy(pref);
    // cuBLASLt answers NOT_SUPPORTED, or no result, for a combination it has
    // no kernel for: the plan keeps no algorithm and run() says so (or runs
    // an aux epilogue unfused, whatever the heuristic's complaint).
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s != CUBLAS_STATUS_SUCCESS && plan.aux))
      returned = 0;
    else
      check_lt(s, "cublasLtMatmulAlgoGetHeuristic");
    results.resize(static_cast<size_t>(returned));
    // Only a result whose state is SUCCESS has valid fields.
    std::erase_if(results, [](const cublasLtMatmulHeuristicResult_t& r) {
      return r.state != CUBLAS_STATUS_SUCCESS;
    });
    plan.algos = std::move(results);
  }

  cublasLtHandle_t handle_ = nullptr;
  int cc_ = 0;
  void* workspace_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace

int cublaslt_version() {
  const Lt& l = loaded_lt();
  return l.error.empty() ? static_cast<int>(l.cublasLtGetVersion()) : 0;
}

std::unique_ptr<GemmEngine> make_cublaslt_engine() { return std::make_unique<CublasLtEngine>(); }

}  // namespace anvil::device::cuda
