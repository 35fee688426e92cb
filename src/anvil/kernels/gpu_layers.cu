// gpu_layers.hpp on CUDA. Element-wise kernels are grid-stride loops over
// bodies.hpp's functions; row kernels run one 256-thread block per row:
// each thread sums its strided share of the row, then the block halves over
// shared memory (the order test_bodies.cpp reproduces on the CPU).
// Parameter gradients of the norms and biases are column sums in two
// stages: chunks of rows, each summed by a block's warps in a fixed
// interleave, then the chunks' partials added in order; a fixed order for
// a given shape, so deterministic (no atomics).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "anvil/base/error.hpp"
#include "anvil/kernels/bodies.hpp"
#include "anvil/kernels/gpu_layers.hpp"

namespace anvil::kernels::gpu {
namespace {

constexpr int kThreads = 256;  // every kernel's block; the row reductions assume it

void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw SystemError(std::string(what) + " launch failed: " + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + ")");
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Blocks for a grid-stride loop over n elements.
unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

__device__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ int64_t grid_stride() {
  return int64_t{gridDim.x} * blockDim.x;
}

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The block's reduction of every thread's v by op (all threads get it).
template <class Op>
__device__ float block_reduce(float v, Op op) {
  __shared__ float lane[kThreads];
  lane[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] = op(lane[threadIdx.x], lane[threadIdx.x + half]);
    __syncthreads();
  }
  const float total = lane[0];
  __syncthreads();  // lane is reused by the next reduction
  return total;
}

__device__ float block_sum(float v) {
  return block_reduce(v, Add{});
}
__device__ float block_max(float v) {
  return block_reduce(v, Max{});
}

__global__ void embedding_kernel(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t N, int64_t T, int64_t C) {
  for (int64_t i = first_index(); i < N * C; i += grid_stride()) {
    const int64_t n = i / C, c = i % C;
    float x = wte[int64_t{tokens[n]} * C + c];
    if (wpe != nullptr) x += wpe[(n % T) * C + c];
    out[i] = x;
  }
}

__global__ void convert_from_bf16_kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

__global__ void convert_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t u = __float_as_uint(src[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
      continue;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    dst[i] = static_cast<uint16_t>(u >> 16);
  }
}

// Block (g, column tile): token g's rows, in order, summed per column.
__global__ void embedding_token_kernel(float* dwte, const float* dout, const int32_t* groups,
                                       int64_t group_count, int64_t C) {
  const int64_t c = blockIdx.y * int64_t{kThreads} + threadIdx.x;
  if (c >= C) return;
  const int32_t* offsets = groups + group_count;
  const int32_t* rows = offsets + group_count + 1;
  float sum = 0.0f;
  for (int32_t i = offsets[blockIdx.x]; i < offsets[blockIdx.x + 1]; ++i)
    sum += dout[int64_t{rows[i]} * C + c];
  dwte[int64_t{groups[blockIdx.x]} * C + c] += sum;
}

// A thread per (position t, column c): the batch rows b T + t, in order.
__global__ void embedding_position_kernel(float* dwpe, const float* dout, int64_t N, int64_t T,
                                          int64_t C) {
  for (int64_t i = first_index(); i < T * C; i += grid_stride()) {
    float sum = 0.0f;
    for (int64_t n = i / C; n < N; n += T) sum += dout[n * C + i % C];
    dwpe[i] += sum;
  }
}

// Two-stage column sums (gpu_layers.hpp's kColumnChunks). Stage one: block
// (x: 32 columns, y: a chunk of rows); lane l of 8 sums rows l, l + 8, ...
// of the chunk, lanes combined in order. For each of `sums` (1 or 2) terms
// term(k, n, c), partial[(k * chunks + chunk) * columns + c].
constexpr int kLanes = kThreads / 32;

struct DoutTerm {  // a bias: dout itself
  const float* dout;
  int64_t columns;
  __device__ float operator()(int, int64_t n, int64_t c) const { return dout[n * columns + c]; }
};

struct NormTerm {  // a norm's weight (norm(n, c) dout) and bias (dout); mean null: RMSNorm
  const float *dout, *inp, *mean, *rstd;
  int64_t columns;
  __device__ float operator()(int k, int64_t n, int64_t c) const {
    const float d = dout[n * columns + c];
    if (k == 1) return d;
    const float x = inp[n * columns + c];
    return (mean != nullptr ? x - mean[n] : x) * rstd[n] * d;
  }
};

template <int kSums, class Term>
__global__ void column_partials_kernel(float* partial, Term term, int64_t N, int64_t columns,
                                       int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * int64_t{32} + (threadIdx.x & 31);
  const int lane = static_cast<int>(threadIdx.x >> 5);
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = min(N, begin + rows_per_chunk);
  float sum[kSums] = {};
  if (c < columns) {
    for (int64_t n = begin + lane; n < end; n += kLanes)
      for (int k = 0; k < kSums; ++k) sum[k] += term(k, n, c);
  }
  __shared__ float lanes[kSums][kLanes][32];
  for (int k = 0; k < kSums; ++k) lanes[k][lane][threadIdx.x & 31] = sum[k];
  __syncthreads();
  if (lane == 0 && c < columns) {
    for (int k = 0; k < kSums; ++k) {
      float total = 0.0f;
      for (int l = 0; l < kLanes; ++l) total += lanes[k][l][threadIdx.x];
      partial[(k * int64_t{gridDim.y} + blockIdx.y) * columns + c] = total;
    }
  }
}

// Stage two: out[c] += the chunks' partials of column c, in order.
__global__ void add_partials_kernel(float* out, const float* partial, int64_t chunks,
                                    int64_t columns) {
  for (int64_t c = first_index(); c < columns; c += grid_stride()) {
    float total = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) total += partial[k * columns + c];
    out[c] += total;
  }
}

// One block per score row; keys after the row's position get probability 0.
__global__ void causal_softmax_forward_kernel(float* scores, float* lse, int64_t T, int64_t queries,
                                              float scale) {
  float* row = scores + blockIdx.x * T;
  const int64_t last = T - queries + blockIdx.x % queries;
  float part = -INFINITY;
  for (int64_t j = threadIdx.x; j <= last; j += kThreads) part = fmaxf(part, scale * row[j]);
  const float mx = block_max(part);
  part = 0.0f;
  for (int64_t j = threadIdx.x; j <= last; j += kThreads) part += fast_exp(scale * row[j] - mx);
  const float l = mx + logf(block_sum(part));
  for (int64_t j = threadIdx.x; j < T; j += kThreads)
    row[j] = j <= last ? body::softmax_probability(row[j], scale, l) : 0.0f;
  if (threadIdx.x == 0) lse[blockIdx.x] = l;
}

__global__ void causal_softmax_backward_kernel(float* dprobs, const float* probs, int64_t T,
                                               float scale) {
  float* d = dprobs + blockIdx.x * T;
  const float* p = probs + blockIdx.x * T;
  const int64_t last = blockIdx.x % T;
  float part = 0.0f;
  for (int64_t j = threadIdx.x; j <= last; j += kThreads) part += p[j] * d[j];
  const float dot = block_sum(part);
  for (int64_t j = threadIdx.x; j < T; j += kThreads)
    d[j] = j <= last ? body::softmax_dscore(p[j], d[j], dot, scale) : 0.0f;
}

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int64_t C, float eps) {
  const float* x = inp + blockIdx.x * C;
  float part = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) part += x[i];
  const float m = block_sum(part) / static_cast<float>(C);
  part = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) part += (x[i] - m) * (x[i] - m);
  const float s = 1.0f / sqrtf(block_sum(part) / static_cast<float>(C) + eps);
  float* o = out + blockIdx.x * C;
  for (int64_t i = threadIdx.x; i < C; i += kThreads)
    o[i] = body::layernorm(x[i], m, s, w[i], b[i]);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
}

__global__ void layernorm_dx_kernel(float* dinp, const float* dout, const float* inp,
                                    const float* w, const float* mean, const float* rstd,
                                    int64_t C) {
  const float* x = inp + blockIdx.x * C;
  const float* d = dout + blockIdx.x * C;
  const float m = mean[blockIdx.x], s = rstd[blockIdx.x];
  float part_dn = 0.0f, part_dnn = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) {
    const float dn = w[i] * d[i];
    part_dn += dn;
    part_dnn += dn * (x[i] - m) * s;
  }
  const float dn_mean = block_sum(part_dn) / static_cast<float>(C);
  const float dnn_mean = block_sum(part_dnn) / static_cast<float>(C);
  float* dx = dinp + blockIdx.x * C;
  for (int64_t i = threadIdx.x; i < C; i += kThreads)
    dx[i] += body::layernorm_dx(w[i] * d[i], (x[i] - m) * s, dn_mean, dnn_mean, s);
}

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w,
                                       int64_t C, float eps) {
  const float* x = inp + blockIdx.x * C;
  float part = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) part += x[i] * x[i];
  const float s = 1.0f / sqrtf(block_sum(part) / static_cast<float>(C) + eps);
  float* o = out + blockIdx.x * C;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) o[i] = body::rmsnorm(x[i], s, w[i]);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
}

__global__ void rmsnorm_dx_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                  const float* rstd, int64_t C) {
  const float* x = inp + blockIdx.x * C;
  const float* d = dout + blockIdx.x * C;
  const float s = rstd[blockIdx.x];
  float part = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += kThreads) part += w[i] * d[i] * x[i] * s;
  const float dot = block_sum(part) / static_cast<float>(C);
  float* dx = dinp + blockIdx.x * C;
  for (int64_t i = threadIdx.x; i < C; i += kThreads)
    dx[i] += body::rmsnorm_dx(x[i] * s, w[i], d[i], s, dot);
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = body::gelu(inp[i]);
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dinp[i] += dout[i] * body::gelu_slope(inp[i]);
}

__global__ void swiglu_forward_kernel(float* out, const float* inp, int64_t N, int64_t F) {
  for (int64_t i = first_index(); i < N * F; i += grid_stride()) {
    const int64_t n = i / F, f = i % F;
    const float* g = inp + n * 2 * F;
    out[i] = body::swiglu(g[f], g[F + f]);
  }
}

__global__ void swiglu_backward_kernel(float* dinp, const float* dout, const float* inp, int64_t N,
                                       int64_t F) {
  for (int64_t i = first_index(); i < N * F; i += grid_stride()) {
    const int64_t n = i / F, f = i % F;
    const float* g = inp + n * 2 * F;
    float* dg = dinp + n * 2 * F;
    body::swiglu_grads_add(g[f], g[F + f], dout[i], dg + f, dg + F + f);
  }
}

__global__ void residual_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

__global__ void rope_kernel(float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads,
                            int64_t head_dim, int64_t rotary_dim, int64_t row_stride, float theta,
                            float sign) {
  const int64_t half = rotary_dim / 2;
  for (int64_t idx = first_index(); idx < N * n_heads * half; idx += grid_stride()) {
    const int64_t i = idx % half, h = (idx / half) % n_heads, n = idx / (half * n_heads);
    const float angle =
        static_cast<float>(pos0 + n % T) *
        body::rope_inv_freq(static_cast<int>(i), static_cast<int>(rotary_dim), theta);
    float* v = x + n * row_stride + h * head_dim;
    body::rope_pair(v + i, v + i + half, cosf(angle), sign * sinf(angle));
  }
}

__global__ void cross_entropy_kernel(float* logits, float* row_loss, const int32_t* targets,
                                     int64_t V, float grad_scale) {
  float* row = logits + blockIdx.x * V;
  const int32_t target = targets[blockIdx.x];
  float part = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) part = fmaxf(part, row[j]);
  const float mx = block_max(part);
  // Every thread reads the target's logit before any thread writes the row.
  const float target_logit = target >= 0 ? row[target] - mx : 0.0f;
  part = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) part += fast_exp(row[j] - mx);
  const float sum = block_sum(part);  // its barriers order the reads above before the writes
  if (target < 0) {
    for (int64_t j = threadIdx.x; j < V; j += kThreads) row[j] = 0.0f;
    if (threadIdx.x == 0) row_loss[blockIdx.x] = 0.0f;
    return;
  }
  const float inv = grad_scale / sum;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = body::cross_entropy_dlogit(fast_exp(row[j] - mx), inv);
    row[j] = j == target ? body::cross_entropy_target(p, grad_scale) : p;
  }
  if (threadIdx.x == 0) row_loss[blockIdx.x] = logf(sum) - target_logit;
}

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n,
                             body::AdamWStep step, float grad_scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    body::adamw(p + i, m + i, v + i, g[i] * grad_scale, step);
}

__global__ void muon_momentum_kernel(float* buf, float* u, const float* g, int64_t n, float mu,
                                     bool nesterov, float grad_scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    u[i] = body::muon_momentum(buf + i, g[i] * grad_scale, mu, nesterov);
}

__global__ void muon_apply_kernel(float* p, const float* u, int64_t n, float decay, float step) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    body::muon_apply(p + i, u[i], decay, step);
}

__global__ void scale_kernel(float* dst, const float* src, int64_t n, float alpha) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = src[i] * alpha;
}

// A block's sum of every thread's v in double, by the same tree every time.
__device__ double block_sum_double(double v) {
  __shared__ double lane[kThreads];
  lane[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  const double total = lane[0];
  __syncthreads();  // every thread has read lane[0] before a next call writes it
  return total;
}

// Block b's partial: the squares of elements b x kThreads + t + k x stride
// (stride = kUnitPartials x kThreads), each thread's in order of k.
__global__ void unit_norm_partials_kernel(const float* u, int64_t n, double* partials) {
  double mine = 0.0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double x = u[i];
    mine += x * x;
  }
  const double total = block_sum_double(mine);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: the partials in order (thread t: t, t + kThreads, ...), a tree,
// then the factor.
__global__ void unit_norm_factor_kernel(const double* partials, float* factor) {
  double mine = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < kUnitPartials; i += kThreads) mine += partials[i];
  const double total = block_sum_double(mine);
  if (threadIdx.x == 0) *factor = body::muon_unit_factor(sqrt(total));
}

__global__ void scale_by_kernel(float* dst, const float* src, int64_t n, const float* factor) {
  const float alpha = *factor;
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = src[i] * alpha;
}

// Grid row y is piece y; the row's blocks stride over that piece.
__global__ void adamw_pieces_kernel(float* p, float* m, float* v, const float* g,
                                    const body::AdamWPiece* pieces, float grad_scale) {
  const body::AdamWPiece piece = pieces[blockIdx.y];
  for (int64_t i = first_index(); i < piece.n; i += grid_stride()) {
    const int64_t at = piece.begin + i, local = piece.local + i;
    body::adamw(p + at, m + local, v + local, g[at] * grad_scale, piece.step);
  }
}

// The largest |g|'s bits: unsigned order is magnitude order, with NaN's and
// infinity's above every finite value's. One atomic per warp.
__global__ void max_abs_bits_kernel(const float* g, int64_t n, uint32_t* bits) {
  uint32_t mine = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    mine = max(mine, __float_as_uint(g[i]) & 0x7fffffffu);
  for (int offset = 16; offset > 0; offset /= 2)
    mine = max(mine, __shfl_down_sync(0xffffffffu, mine, offset));
  if ((threadIdx.x & 31) == 0) atomicMax(bits, mine);
}

// Fixed-point squares summed as integers: a thread's low 42 bits and the
// rest apart (each below 2^42 after the carry, so a warp's 32 stay below
// 2^47), one pair of atomics per warp; 65535 x 8 warps x 2^42 < 2^64.
__global__ void fixed_square_sum_kernel(const float* g, int64_t n, double factor,
                                        unsigned long long* sums) {
  constexpr unsigned long long kMask = (1ull << 42) - 1;
  unsigned long long lo = 0, hi = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const unsigned long long q = body::fixed_square(g[i], factor);
    lo += q & kMask;
    hi += q >> 42;
  }
  hi += lo >> 42;
  lo &= kMask;
  for (int offset = 16; offset > 0; offset /= 2) {
    lo += __shfl_down_sync(0xffffffffu, lo, offset);
    hi += __shfl_down_sync(0xffffffffu, hi, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(sums, lo & kMask);
    atomicAdd(sums + 1, hi + (lo >> 42));
  }
}

// Rows per launch: gridDim.x's limit.
constexpr int64_t kMaxRows = 2147483647;

void check_rows(int64_t N, const char* what) {
  if (N > kMaxRows)
    throw InputError(std::string(what) + ": expected at most 2^31 - 1 rows, got " +
                     std::to_string(N));
}

// The two stages for `sums` terms over N rows and `columns` columns; outs[k]
// (null: skipped) += the sums of term k.
template <int kSums, class Term>
void column_sums(float* const (&outs)[kSums], Term term, int64_t N, int64_t columns, float* scratch,
                 cudaStream_t stream, const char* what) {
  if (N == 0 || columns == 0) return;
  const int64_t rows_per_chunk = (N + kColumnChunks - 1) / kColumnChunks;
  const int64_t chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  const dim3 grid(static_cast<unsigned>((columns + 31) / 32), static_cast<unsigned>(chunks));
  column_partials_kernel<kSums>
      <<<grid, kThreads, 0, stream>>>(scratch, term, N, columns, rows_per_chunk);
  launched(what);
  for (int k = 0; k < kSums; ++k) {
    if (outs[k] == nullptr) continue;
    add_partials_kernel<<<blocks_for(columns), kThreads, 0, stream>>>(
        outs[k], scratch + k * chunks * columns, chunks, columns);
    launched(what);
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t N, int64_t T, int64_t C, void* stream) {
  embedding_kernel<<<blocks_for(N * C), kThreads, 0, as_stream(stream)>>>(out, tokens, wte, wpe, N,
                                                                          T, C);
  launched("embedding_forward");
}

void convert_to_bf16(uint16_t* dst, const float* src, int64_t n, void* stream) {
  convert_to_bf16_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, src, n);
  launched("convert_to_bf16");
}

void convert_from_bf16(float* dst, const uint16_t* src, int64_t n, void* stream) {
  convert_from_bf16_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, src, n);
  launched("convert_from_bf16");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* groups,
                        int64_t group_count, int64_t N, int64_t T, int64_t C, void* stream) {
  if (N == 0 || C == 0) return;
  check_rows(group_count, "embedding_backward");
  const dim3 grid(static_cast<unsigned>(group_count),
                  static_cast<unsigned>((C + kThreads - 1) / kThreads));
  if (group_count > 0) {
    embedding_token_kernel<<<grid, kThreads, 0, as_stream(stream)>>>(dwte, dout, groups,
                                                                     group_count, C);
    launched("embedding_backward (tokens)");
  }
  if (dwpe != nullptr) {
    embedding_position_kernel<<<blocks_for(T * C), kThreads, 0, as_stream(stream)>>>(dwpe, dout, N,
                                                                                     T, C);
    launched("embedding_backward (positions)");
  }
}

void bias_backward(float* dbias, const float* dout, int64_t N, int64_t OC, float* scratch,
                   void* stream) {
  float* const outs[1] = {dbias};
  column_sums<1>(outs, DoutTerm{dout, OC}, N, OC, scratch, as_stream(stream), "bias_backward");
}

void causal_softmax_forward(float* scores, float* lse, int64_t rows, int64_t T, int64_t queries,
                            float scale, void* stream) {
  check_rows(rows, "causal_softmax_forward");
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, as_stream(stream)>>>(
      scores, lse, T, queries, scale);
  launched("causal_softmax_forward");
}

void causal_softmax_backward(float* dprobs, const float* probs, int64_t rows, int64_t T,
                             float scale, void* stream) {
  check_rows(rows, "causal_softmax_backward");
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, as_stream(stream)>>>(
      dprobs, probs, T, scale);
  launched("causal_softmax_backward");
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps, void* stream) {
  check_rows(N, "layernorm_forward");
  if (N == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, as_stream(stream)>>>(
      out, mean, rstd, inp, weight, bias, C, eps);
  launched("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C, float* scratch, void* stream) {
  check_rows(N, "layernorm_backward");
  if (N == 0) return;
  layernorm_dx_kernel<<<static_cast<unsigned>(N), kThreads, 0, as_stream(stream)>>>(
      dinp, dout, inp, weight, mean, rstd, C);
  launched("layernorm_backward (input)");
  float* const outs[2] = {dweight, dbias};
  column_sums<2>(outs, NormTerm{dout, inp, mean, rstd, C}, N, C, scratch, as_stream(stream),
                 "layernorm_backward (parameters)");
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps, void* stream) {
  check_rows(N, "rmsnorm_forward");
  if (N == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, as_stream(stream)>>>(
      out, rstd, inp, weight, C, eps);
  launched("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C, float* scratch,
                      void* stream) {
  check_rows(N, "rmsnorm_backward");
  if (N == 0) return;
  rmsnorm_dx_kernel<<<static_cast<unsigned>(N), kThreads, 0, as_stream(stream)>>>(dinp, dout, inp,
                                                                                  weight, rstd, C);
  launched("rmsnorm_backward (input)");
  float* const outs[1] = {dweight};
  column_sums<1>(outs, NormTerm{dout, inp, nullptr, rstd, C}, N, C, scratch, as_stream(stream),
                 "rmsnorm_backward (parameters)");
}

void gelu_forward(float* out, const float* inp, int64_t n, void* stream) {
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(out, inp, n);
  launched("gelu_forward");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, void* stream) {
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dinp, inp, dout, n);
  launched("gelu_backward");
}

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F, void* stream) {
  swiglu_forward_kernel<<<blocks_for(N * F), kThreads, 0, as_stream(stream)>>>(out, inp, N, F);
  launched("swiglu_forward");
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F,
                     void* stream) {
  swiglu_backward_kernel<<<blocks_for(N * F), kThreads, 0, as_stream(stream)>>>(dinp, dout, inp, N,
                                                                                F);
  launched("swiglu_backward");
}

void residual_forward(float* out, const float* a, const float* b, int64_t n, void* stream) {
  residual_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(out, a, b, n);
  launched("residual_forward");
}

void rope_apply(float* x, int64_t N, int64_t T, int64_t pos0, int64_t n_heads, int64_t head_dim,
                int64_t rotary_dim, int64_t row_stride, float theta, float sign, void* stream) {
  rope_kernel<<<blocks_for(N * n_heads * (rotary_dim / 2)), kThreads, 0, as_stream(stream)>>>(
      x, N, T, pos0, n_heads, head_dim, rotary_dim, row_stride, theta, sign);
  launched("rope_apply");
}

void cross_entropy(float* logits, float* row_loss, const int32_t* targets, int64_t N, int64_t V,
                   float grad_scale, void* stream) {
  check_rows(N, "cross_entropy");
  if (N == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(N), kThreads, 0, as_stream(stream)>>>(
      logits, row_loss, targets, V, grad_scale);
  launched("cross_entropy");
}

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                  const body::AdamWStep& step, float grad_scale, void* stream) {
  adamw_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(params, m, v, grads, n, step,
                                                                  grad_scale);
  launched("adamw_update");
}

void adamw_pieces(float* params, float* m, float* v, const float* grads,
                  const body::AdamWPiece* pieces, int64_t count, int64_t longest, float grad_scale,
                  void* stream) {
  if (count <= 0) return;
  if (count > 65535) throw InputError("adamw_pieces: at most 65535 pieces per launch");
  // Up to 64 blocks per piece: the longest pieces' rows stride, the short
  // ones' extra blocks return at once.
  const unsigned per_piece = std::min(blocks_for(longest), 64u);
  const dim3 grid(per_piece, static_cast<unsigned>(count));
  adamw_pieces_kernel<<<grid, kThreads, 0, as_stream(stream)>>>(params, m, v, grads, pieces,
                                                                grad_scale);
  launched("adamw_pieces");
}

void muon_momentum(float* buf, float* u, const float* g, int64_t n, float mu, bool nesterov,
                   float grad_scale, void* stream) {
  muon_momentum_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(buf, u, g, n, mu,
                                                                          nesterov, grad_scale);
  launched("muon_momentum");
}

void muon_apply(float* p, const float* u, int64_t n, float decay, float step, void* stream) {
  muon_apply_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, u, n, decay, step);
  launched("muon_apply");
}

void scale(float* dst, const float* src, int64_t n, float alpha, void* stream) {
  scale_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, src, n, alpha);
  launched("scale");
}

void scale_to_unit_norm(float* x, const float* u, int64_t n, double* partials, float* factor,
                        void* stream) {
  // A fixed grid (kUnitPartials blocks, whatever n and the GPU): the sum's
  // order, so its bits, depend on n alone.
  unit_norm_partials_kernel<<<kUnitPartials, kThreads, 0, as_stream(stream)>>>(u, n, partials);
  launched("unit_norm_partials");
  unit_norm_factor_kernel<<<1, kThreads, 0, as_stream(stream)>>>(partials, factor);
  launched("unit_norm_factor");
  scale_by_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, u, n, factor);
  launched("scale_by");
}

void max_abs_bits(const float* g, int64_t n, uint32_t* bits, void* stream) {
  max_abs_bits_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(g, n, bits);
  launched("max_abs_bits");
}

void fixed_square_sum(const float* g, int64_t n, double factor, unsigned long long* sums,
                      void* stream) {
  fixed_square_sum_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(g, n, factor, sums);
  launched("fixed_square_sum");
}

}  // namespace anvil::kernels::gpu
