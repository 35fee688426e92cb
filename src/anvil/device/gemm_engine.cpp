#include "anvil/device/gemm_engine.hpp"

#include <cstring>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/device/cuda_backend.hpp"

namespace anvil::device {

std::string to_string(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return "none";
    case Epilogue::bias:
      return "bias";
    case Epilogue::gelu:
      return "gelu";
    case Epilogue::bias_gelu:
      return "bias+gelu";
    case Epilogue::bias_gelu_aux:
      return "bias+gelu+aux";
    case Epilogue::dgelu:
      return "dgelu";
  }
  return "?";
}

Dtype GemmDesc::out_type() const {
  if (out_f32 || type == Dtype::fp32 || type == Dtype::tf32) return Dtype::fp32;
  return type == Dtype::fp16 ? Dtype::fp16 : Dtype::bf16;
}

std::string GemmDesc::describe() const {
  std::string s = anvil::to_string(type) + " " + (trans_a ? "T" : "N") + (trans_b ? "T" : "N") +
                  " " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                  " -> " + anvil::to_string(out_type());
  if (epilogue != Epilogue::none) s += " +" + to_string(epilogue);
  if (batch != 1) s += " x" + std::to_string(batch);
  return s;
}

std::vector<unsigned char> encode(const std::vector<float>& values, Dtype type) {
  std::vector<unsigned char> out(values.size() * dtype_bytes(type));
  if (type == Dtype::fp32 || type == Dtype::tf32) {
    std::memcpy(out.data(), values.data(), out.size());
  } else if (type == Dtype::bf16) {
    auto* b = reinterpret_cast<bf16*>(out.data());
    for (size_t i = 0; i < values.size(); ++i) b[i] = to_bf16(values[i]);
  } else if (type == Dtype::fp16 || type == Dtype::fp8) {
    cuda::encode_narrow(values.data(), values.size(), type, out.data());
  } else {
    throw InputError("encode: no GEMM type " + anvil::to_string(type));
  }
  return out;
}

std::vector<float> decode(const std::vector<unsigned char>& bytes, Dtype type) {
  std::vector<float> out(bytes.size() / dtype_bytes(type));
  if (type == Dtype::fp32 || type == Dtype::tf32) {
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  } else if (type == Dtype::bf16) {
    const auto* b = reinterpret_cast<const bf16*>(bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = to_float(b[i]);
  } else if (type == Dtype::fp16 || type == Dtype::fp8) {
    cuda::decode_narrow(bytes.data(), out.size(), type, out.data());
  } else {
    throw InputError("decode: no GEMM type " + anvil::to_string(type));
  }
  return out;
}

void check_operands(const GemmDesc& d, const void* bias, const void* aux) {
  if (has_bias(d.epilogue) && bias == nullptr)
    throw InputError("gemm " + d.describe() + ": the bias epilogue needs a bias");
  if (uses_aux(d.epilogue) && aux == nullptr)
    throw InputError("gemm " + d.describe() + ": the epilogue needs an aux matrix");
}

namespace {

// The CPU engine: device::gemm, then the epilogue per element.
class CpuGemmEngine final : public GemmEngine {
 public:
  explicit CpuGemmEngine(GemmBackend backend) : backend_(backend) {}
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu (" + device::to_string(backend_) + ")"; }

  std::string unsupported(const GemmDesc& d) const override {
    if (d.batch < 1) return "expected a batch of at least 1";
    if (d.type != Dtype::fp32 && d.type != Dtype::bf16)
      return "the CPU engine multiplies fp32 and bf16, not " + anvil::to_string(d.type);
    if (!d.out_f32 && d.type != Dtype::fp32) return "the CPU engine writes fp32 output only";
    if (uses_aux(d.epilogue) && d.batch != 1) return "the aux epilogues take no batch";
    return "";
  }

  int candidates(const GemmDesc&, int max) override { return max > 0 ? 1 : 0; }

  void run(const GemmDesc& d, const void* a, const void* b, void* c, const void* bias,
           Stream& stream, int algo, void* aux) override {
    const std::string why = unsupported(d);
    if (!why.empty()) throw InputError("gemm " + d.describe() + ": " + why);
    check_operands(d, bias, aux);
    if (d.batch > 1) {  // one GEMM at a time, at the strides
      GemmDesc one = d;
      one.batch = 1;
      const auto in = static_cast<int64_t>(dtype_bytes(d.type));
      for (int64_t i = 0; i < d.batch; ++i) {
        run(one, static_cast<const char*>(a) + i * d.stride_a * in,
            static_cast<const char*>(b) + i * d.stride_b * in,
            static_cast<float*>(c) + i * d.stride_c, bias, stream, algo, aux);
      }
      return;
    }
    float* out = static_cast<float*>(c);
    if (d.type == Dtype::fp32) {
      gemm(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, static_cast<const float*>(a),
           d.a_stride(), static_cast<const float*>(b), d.b_stride(), d.beta, out, d.c_stride(),
           backend_);
    } else {
      gemm(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, static_cast<const bf16*>(a),
           d.a_stride(), static_cast<const bf16*>(b), d.b_stride(), d.beta, out, d.c_stride(),
           backend_);
    }
    if (d.epilogue == Epilogue::none) return;
    const float* bias_f = static_cast<const float*>(bias);
    const int64_t ldc = d.c_stride();
    for (int64_t i = 0; i < d.m; ++i) {
      float* row = out + i * ldc;
      if (uses_aux(d.epilogue)) {
        float* aux_row = static_cast<float*>(aux) + i * ldc;
        for (int64_t j = 0; j < d.n; ++j)
          row[j] = apply_epilogue(d.epilogue, row[j], bias_f ? bias_f[j] : 0.0f, aux_row[j]);
      } else {
        for (int64_t j = 0; j < d.n; ++j)
          row[j] = apply_epilogue(d.epilogue, row[j], bias_f ? bias_f[j] : 0.0f);
      }
    }
  }

 private:
  GemmBackend backend_;
};

}  // namespace

std::unique_ptr<GemmEngine> make_gemm_engine(DeviceKind kind, GemmBackend cpu_backend) {
  if (kind == DeviceKind::cpu) return std::make_unique<CpuGemmEngine>(cpu_backend);
  require(kind, "--device");
  return cuda::make_cublaslt_engine();
}

}  // namespace anvil::device
