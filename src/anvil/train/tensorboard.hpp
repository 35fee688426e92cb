// TensorBoard event files (`anvil train --tensorboard DIR`): scalars as
// TensorFlow Event protocol buffers in TFRecord framing, which TensorBoard
// (and its EventAccumulator) reads. Each record is: u64 length, u32 masked
// CRC-32C of the length, the bytes, u32 masked CRC-32C of the bytes. The
// first event carries file_version "brain.Event:2"; each later one a
// wall time, a step and a Summary of (tag, simple_value) pairs. The few
// protobuf fields needed are encoded here by hand (docs/train.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace anvil::train {

class EventWriter {
 public:
  // Creates DIR (if needed) and DIR/events.out.tfevents.<unix time>.<host>.
  // Throws SystemError when it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // One event: every (tag, value) at `step`; flushed.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace anvil::train
