// Context parallelism's attention (all-gathered K/V) and halos; see the header.
#include "anvil/model/context_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "anvil/base/error.hpp"
#include "anvil/kernels/layers.hpp"

namespace anvil::model {

ContextParallel::ContextParallel(ContextGroup* group, int64_t B, int64_t T)
    : group_(group != nullptr && group->size() > 1 ? group : nullptr), B_(B) {
  layout_.size = group_ ? group_->size() : 1;
  layout_.rank = group_ ? group_->rank() : 0;
  layout_.seq = T;
  if (split() && (T % (2 * layout_.size) != 0 || layout_.chunk() < 2))
    throw InputError("context parallelism: sequence length " + std::to_string(T) +
                     " must be a multiple of 2 x " + std::to_string(layout_.size) +
                     " with chunks of at least 2 tokens");
}

namespace {

// One layout of the shared buffers for carving and for counting.
void take_buffers(Carver& c, int64_t B, int64_t T, int size, int64_t w, float** natural,
                  float** ranked, float** dnatural, float** local) {
  *natural = c.take<float>(B * T * w);
  *ranked = c.take<float>(B * T * w);
  *dnatural = c.take<float>(B * T * w);
  *local = c.take<float>(B * (T / size) * w);
}

}  // namespace

void ContextParallel::carve(Carver& c, int64_t kv_width) {
  if (!split()) return;
  kv_width_ = kv_width;
  take_buffers(c, B_, layout_.seq, layout_.size, kv_width, &natural_, &ranked_, &dnatural_,
               &local_);
}

size_t ContextParallel::scratch_bytes(int64_t B, int64_t T, int size, int64_t kv_width) {
  if (size <= 1) return 0;
  Carver count;
  float *a, *b, *c, *d;
  take_buffers(count, B, T, size, kv_width, &a, &b, &c, &d);
  return count.bytes();
}

void ContextParallel::reorder(float* natural, float* ranked, int64_t w, bool to_natural) const {
  const int64_t S = chunk(), Tl = local(), T = layout_.seq;
  const size_t bytes = static_cast<size_t>(S * w) * sizeof(float);
  for (int q = 0; q < layout_.size; ++q)
    for (int64_t b = 0; b < B_; ++b)
      for (int p = 0; p < 2; ++p) {
        float* n = natural + (b * T + layout_.chunk_of(q, p) * S) * w;
        float* r = ranked + ((q * B_ + b) * Tl + p * S) * w;
        std::memcpy(to_natural ? n : r, to_natural ? r : n, bytes);
      }
}

namespace {

kernels::AttentionView chunk_view(const ContextLayout& L, int p, int64_t B, float* out, float* lse,
                                  const float* qkv, const float* natural, int64_t Hq, int64_t Hkv,
                                  int64_t D) {
  const int64_t S = L.chunk(), Tl = L.local(), W = (Hq + 2 * Hkv) * D, KVW = 2 * Hkv * D;
  kernels::AttentionView a;
  a.B = B;
  a.Tq = S;
  a.q0 = L.start(p);
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.q = qkv + p * S * W;
  a.q_row = W;
  a.q_batch = Tl * W;
  a.k = natural;
  a.v = natural + Hkv * D;
  a.kv_row = KVW;
  a.kv_batch = L.seq * KVW;
  a.out = out + p * S * Hq * D;
  a.out_row = Hq * D;
  a.out_batch = Tl * Hq * D;
  a.lse = lse + p * B * Hq * S;
  return a;
}

}  // namespace

void ContextParallel::gather_kv(const float* qkv, int64_t W, int64_t off, int64_t KVW) {
  if (KVW > kv_width_)
    throw InputError("context parallelism: K/V width " + std::to_string(KVW) +
                     " exceeds the planned " + std::to_string(kv_width_));
  const int64_t Tl = local();
  for (int64_t n = 0; n < B_ * Tl; ++n)
    std::memcpy(local_ + n * KVW, qkv + n * W + off, static_cast<size_t>(KVW) * sizeof(float));
  const double t0 = now_seconds();
  group_->allgather(local_, ranked_, static_cast<size_t>(B_ * Tl * KVW));
  kv_seconds_ += now_seconds() - t0;
  reorder(natural_, ranked_, KVW, true);
}

void ContextParallel::attention_forward(float* out, float* lse, const float* qkv, int64_t Hq,
                                        int64_t Hkv, int64_t D, kernels::AttentionTiles tiles) {
  gather_kv(qkv, (Hq + 2 * Hkv) * D, Hq * D, 2 * Hkv * D);
  for (int p = 0; p < 2; ++p)
    kernels::attention_forward(chunk_view(layout_, p, B_, out, lse, qkv, natural_, Hq, Hkv, D),
                               tiles);
}

void ContextParallel::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                         const float* out, const float* lse, int64_t Hq,
                                         int64_t Hkv, int64_t D, kernels::AttentionTiles tiles) {
  const int64_t W = (Hq + 2 * Hkv) * D, KVW = 2 * Hkv * D, Tl = local(), S = chunk(),
                T = layout_.seq;
  gather_kv(qkv, W, Hq * D, KVW);
  std::fill(dnatural_, dnatural_ + B_ * T * KVW, 0.0f);
  for (int p = 0; p < 2; ++p) {
    const kernels::AttentionView a =
        chunk_view(layout_, p, B_, const_cast<float*>(out), const_cast<float*>(lse), qkv, natural_,
                   Hq, Hkv, D);
    kernels::AttentionGrads g;
    g.dq = dqkv + p * S * W;
    g.dq_row = W;
    g.dq_batch = Tl * W;
    g.dk = dnatural_;
    g.dv = dnatural_ + Hkv * D;
    g.dkv_row = KVW;
    g.dkv_batch = T * KVW;
    g.accumulate_kv = true;
    kernels::attention_backward(a, dout + p * S * Hq * D, g, tiles);
  }
  // dK/dV of every key, in the ranks' order, summed over the group onto
  // the keys' owners.
  reorder(dnatural_, ranked_, KVW, false);
  const double t0 = now_seconds();
  group_->reduce_scatter(ranked_, local_, static_cast<size_t>(B_ * Tl * KVW));
  kv_seconds_ += now_seconds() - t0;
  for (int64_t n = 0; n < B_ * Tl; ++n)
    std::memcpy(dqkv + n * W + Hq * D, local_ + n * KVW, static_cast<size_t>(KVW) * sizeof(float));
}

void ContextParallel::halo_forward(float* heads, const float* rows, int64_t stride, int64_t width,
                                   int64_t n) {
  const int64_t S = chunk(), msg = B_ * n * width;
  std::fill(heads, heads + 2 * msg, 0.0f);
  if (!split()) return;
  const int64_t chunks = 2 * layout_.size;
  auto unpack = [&](const float* buf, int p) {
    for (int64_t b = 0; b < B_; ++b)
      std::memcpy(heads + (2 * b + p) * n * width, buf + b * n * width,
                  static_cast<size_t>(n * width) * sizeof(float));
  };
  std::vector<ContextGroup::Message> sends, recvs;
  for (int p = 0; p < 2; ++p) {
    send_[p].resize(static_cast<size_t>(msg));
    recv_[p].resize(static_cast<size_t>(msg));
    const int64_t k = layout_.chunk_index(p);
    if (k + 1 < chunks) {  // this chunk's tail is the next chunk's head
      for (int64_t b = 0; b < B_; ++b)
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(send_[p].data() + (b * n + i) * width,
                      rows + ((2 * b + p) * S + S - n + i) * stride,
                      static_cast<size_t>(width) * sizeof(float));
      const int dest = layout_.owner(k + 1);
      if (dest == layout_.rank)
        unpack(send_[p].data(), layout_.slot(k + 1));
      else
        sends.push_back({send_[p].data(), static_cast<size_t>(msg), dest, static_cast<int>(k)});
    }
    if (k > 0 && layout_.owner(k - 1) != layout_.rank)
      recvs.push_back({recv_[p].data(), static_cast<size_t>(msg), layout_.owner(k - 1),
                       static_cast<int>(k - 1)});
  }
  const double t0 = now_seconds();
  group_->exchange(sends, recvs);
  halo_seconds_ += now_seconds() - t0;
  for (int p = 0; p < 2; ++p) {
    const int64_t k = layout_.chunk_index(p);
    if (k > 0 && layout_.owner(k - 1) != layout_.rank) unpack(recv_[p].data(), p);
  }
}

void ContextParallel::halo_backward(float* d_rows, int64_t stride, const float* dheads,
                                    int64_t width, int64_t n) {
  if (!split()) return;
  const int64_t S = chunk(), msg = B_ * n * width, chunks = 2 * layout_.size;
  // Adds a message [B][n][width] to the last n rows of local chunk p.
  auto add_tail = [&](const float* buf, int p) {
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t i = 0; i < n; ++i) {
        float* row = d_rows + ((2 * b + p) * S + S - n + i) * stride;
        const float* g = buf + (b * n + i) * width;
        for (int64_t j = 0; j < width; ++j) row[j] += g[j];
      }
  };
  std::vector<ContextGroup::Message> sends, recvs;
  for (int p = 0; p < 2; ++p) {
    send_[p].resize(static_cast<size_t>(msg));
    recv_[p].resize(static_cast<size_t>(msg));
    const int64_t k = layout_.chunk_index(p);
    if (k > 0) {  // this chunk's head gradient goes back to the previous chunk's rows
      for (int64_t b = 0; b < B_; ++b)
        std::memcpy(send_[p].data() + b * n * width, dheads + (2 * b + p) * n * width,
                    static_cast<size_t>(n * width) * sizeof(float));
      const int src = layout_.owner(k - 1);
      if (src == layout_.rank)
        add_tail(send_[p].data(), layout_.slot(k - 1));
      else
        sends.push_back({send_[p].data(), static_cast<size_t>(msg), src, static_cast<int>(k - 1)});
    }
    if (k + 1 < chunks && layout_.owner(k + 1) != layout_.rank)
      recvs.push_back(
          {recv_[p].data(), static_cast<size_t>(msg), layout_.owner(k + 1), static_cast<int>(k)});
  }
  const double t0 = now_seconds();
  group_->exchange(sends, recvs);
  halo_seconds_ += now_seconds() - t0;
  for (int p = 0; p < 2; ++p) {
    const int64_t k = layout_.chunk_index(p);
    if (k + 1 < chunks && layout_.owner(k + 1) != layout_.rank) add_tail(recv_[p].data(), p);
  }
}

}  // namespace anvil::model
