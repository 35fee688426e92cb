#include "anvil/device/gemm_onednn.hpp"

#include <omp.h>

#include <dnnl.hpp>
#include <string>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>
#include "anvil/base/cpu.hpp"

namespace anvil::device::detail {
namespace {

using dnnl::memory;

// oneDNN fixes a primitive's thread count when it is created, so the thread
// count is part of the key: a primitive made for 1 thread would run on 1.
// With any_rows the token dimension (the rows of A as stored: m, or k when A
// is transposed) is left to run time and is -1 in the key: one primitive
// serves every row count (oneDNN then runs its JIT GEMM, not brgemm).
struct Key {
  bool bf16, trans_a, trans_b, any_rows;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int threads;
  auto tie() const {
    return std::tie(bf16, trans_a, trans_b, any_rows, m, n, k, lda, ldb, ldc, alpha, beta,
                    threads);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  dnnl::matmul primitive;
  memory::desc a, b, c, scratchpad;
};

struct Descs {
  memory::desc a, b, c;
};

// Row-major strides; a transposed operand is the same buffer read column-wise.
Descs descs(const Key& key, int64_t m, int64_t k) {
  const auto dt = key.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  return {memory::desc({m, k}, dt,
                       key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1}),
          memory::desc({k, key.n}, dt,
                       key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1}),
          memory::desc({m, key.n}, memory::data_type::f32, memory::dims{key.ldc, 1})};
}

// ANVIL_ISA=avx2: oneDNN's kernels held to AVX2, once, before its first
// primitive or engine (it refuses the limit afterwards).
void limit_isa() {
  static const bool done = [] {
    if (cpu_info().isa_limit == "avx2") dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx2);
    return true;
  }();
  (void)done;
}

class OneDnn {
 public:
  OneDnn() : engine_((limit_isa(), dnnl::engine(dnnl::engine::kind::cpu, 0))) {}

  // m and k are the call's own (the key's may be -1: see Key::any_rows).
  void run(const Key& key, int64_t m, int64_t k, const void* a, const void* b, float* c) {
    // Held by a shared_ptr: another thread's lookup may clear the cache meanwhile.
    const std::shared_ptr<const Entry> e = lookup(key);
    // One stream per calling thread: creating one per call costs microseconds.
    thread_local dnnl::stream stream(engine_);
    const Descs d = key.any_rows ? descs(key, m, k) : Descs{e->a, e->b, e->c};
    memory ma(d.a, engine_, const_cast<void*>(a));
    memory mb(d.b, engine_, const_cast<void*>(b));
    memory mc(d.c, engine_, c);
    // Each calling thread's own scratchpad: oneDNN's library-managed one is
    // shared by every primitive of the process, so two threads executing at
    // once (Muon's batched bf16 GEMMs) would overwrite each other's.
    thread_local std::vector<uint8_t> scratch;
    if (scratch.size() < e->scratchpad.get_size()) scratch.resize(e->scratchpad.get_size());
    memory ms(e->scratchpad, engine_, scratch.data());
    e->primitive.execute(stream, {{DNNL_ARG_SRC, ma},
                                  {DNNL_ARG_WEIGHTS, mb},
                                  {DNNL_ARG_DST, mc},
                                  {DNNL_ARG_SCRATCHPAD, ms}});
    stream.wait();
  }

 private:
  std::shared_ptr<const Entry> lookup(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= kCapacity) cache_.clear();  // shapes in a run are few
    const Descs d = descs(key, key.m < 0 ? DNNL_RUNTIME_DIM_VAL : key.m,
                          key.k < 0 ? DNNL_RUNTIME_DIM_VAL : key.k);
    const memory::desc &a = d.a, &b = d.b, &c = d.c;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(key.beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    return cache_
        .emplace(key, std::make_shared<const Entry>(
                          Entry{dnnl::matmul(pd), a, b, c, pd.scratchpad_desc()}))
        .first->second;
  }

  static constexpr size_t kCapacity = 512;
  dnnl::engine engine_;
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Entry>> cache_;
};

OneDnn& onednn() {
  static OneDnn instance;
  return instance;
}

}  // namespace

void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  onednn().run(Key{false, trans_a, trans_b, false, m, n, k, lda, ldb, ldc, alpha, beta,
                   omp_get_max_threads()},
               m, k, a, b, c);
}

void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c,
                 int64_t ldc, bool any_rows) {
  // The token dimension: rows of A as stored, m (A) or k (A^T, whose k rows B shares).
  const int64_t km = any_rows && !trans_a ? -1 : m, kk = any_rows && trans_a ? -1 : k;
  onednn().run(Key{true, trans_a, trans_b, any_rows, km, n, kk, lda, ldb, ldc, alpha, beta,
                   omp_get_max_threads()},
               m, k, a, b, c);
}

}  // namespace anvil::device::detail

namespace anvil::device {

std::string onednn_cpu_isa() {
  detail::limit_isa();
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

}  // namespace anvil::device
