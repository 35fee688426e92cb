#include "anvil/optim/device_adamw.hpp"

#include <algorithm>

#include "anvil/kernels/device_layers.hpp"

namespace anvil::optim {
namespace {

// The update's table cuts a piece into parts of at most this many elements:
// the GPU kernel gives every row of the table the same blocks, so one long
// row (gpt2's 38.6M-element embedding) would run on those few blocks alone.
constexpr int64_t kRowElements = int64_t{1} << 20;

size_t table_rows(const AdamW& mirror) {
  size_t rows = 0;
  for (const AdamW::Piece& piece : mirror.pieces())
    rows += static_cast<size_t>((piece.end - piece.begin + kRowElements - 1) / kRowElements);
  return rows;
}

device::ArenaPlan state_plan(size_t moment_bytes, size_t pieces) {
  device::ArenaPlan plan;
  plan.add(moment_bytes);
  plan.add(moment_bytes);
  plan.add(std::max<size_t>(1, pieces) * sizeof(kernels::body::AdamWPiece));
  return plan;
}

}  // namespace

DeviceAdamW::DeviceAdamW(AdamW& mirror, device::Stream& stream)
    : mirror_(mirror),
      stream_(stream),
      moment_bytes_(mirror.state_bytes() / 2),
      arena_(stream.kind(), "adamw state", state_plan(moment_bytes_, table_rows(mirror))),
      norm_(stream) {
  m_ = static_cast<float*>(arena_.take(moment_bytes_));
  v_ = static_cast<float*>(arena_.take(moment_bytes_));
  table_ = arena_.take<kernels::body::AdamWPiece>(std::max<size_t>(1, table_rows(mirror)));
  upload();
}

void DeviceAdamW::update(float* params, const float* grads, float lr, int64_t step,
                         float grad_scale) {
  pieces_.clear();
  for (const AdamW::Piece& piece : mirror_.pieces()) {
    const kernels::body::AdamWStep constants = mirror_.constants(piece, lr, step);
    for (int64_t at = 0; at < piece.end - piece.begin; at += kRowElements) {
      pieces_.push_back({piece.begin + at, piece.local + at,
                         std::min(kRowElements, piece.end - piece.begin - at), constants});
    }
  }
  kernels::dev::adamw(stream_, params, m_, v_, grads, pieces_, table_, grad_scale);
}

void DeviceAdamW::download() {
  device::copy(mirror_.exp_avg(), m_, moment_bytes_, device::CopyKind::device_to_host, stream_);
  device::copy(mirror_.exp_avg_sq(), v_, moment_bytes_, device::CopyKind::device_to_host, stream_);
  stream_.synchronize();
}

void DeviceAdamW::upload() {
  device::copy(m_, mirror_.exp_avg(), moment_bytes_, device::CopyKind::host_to_device, stream_);
  device::copy(v_, mirror_.exp_avg_sq(), moment_bytes_, device::CopyKind::host_to_device, stream_);
  stream_.synchronize();
}

}  // namespace anvil::optim
