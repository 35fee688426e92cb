#include "anvil/train/tensorboard.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "anvil/base/checksum.hpp"
#include "anvil/base/error.hpp"

namespace anvil::train {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void fixed(std::string& out, T v) {  // little-endian, as x86-64 stores it
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof v);
}

// A length-delimited field (wire type 2).
void bytes_field(std::string& out, int field, const std::string& bytes) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}

// Event{wall_time = 1 (double), step = 2 (int64)} prefix.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  varint(e, 1 << 3 | 1);
  fixed(e, wall_time);
  varint(e, 2 << 3 | 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

}  // namespace

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw SystemError("--tensorboard: " + dir + ": cannot create directory: " + ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = unix_seconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host +
          "." + std::to_string(::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) throw SystemError("--tensorboard: " + path_ + ": cannot create");
  std::string e = event_head(now, 0);
  bytes_field(e, 3, "brain.Event:2");  // file_version
  record(e);
}

EventWriter::~EventWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventWriter::record(const std::string& event) {
  std::string r;
  fixed(r, static_cast<uint64_t>(event.size()));
  fixed(r, masked_crc(r.data(), 8));
  r += event;
  fixed(r, masked_crc(event.data(), event.size()));
  const long at = std::ftell(file_);
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size() || std::fflush(file_) != 0) {
    // A record written in part is cut back off, so the file stays whole
    // records (TensorBoard stops reading at a bad one) and the next fits.
    const int err = errno;
    std::clearerr(file_);
    if (at >= 0 && ::ftruncate(::fileno(file_), at) == 0) std::fseek(file_, at, SEEK_SET);
    throw SystemError(path_ + ": write failed: " + std::strerror(err), err);
  }
}

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);  // Summary.Value.tag
    varint(value, 2 << 3 | 5);   // simple_value (float)
    fixed(value, static_cast<float>(v));
    bytes_field(summary, 1, value);  // Summary.value
  }
  std::string e = event_head(unix_seconds(), step);
  bytes_field(e, 5, summary);  // Event.summary
  record(e);
}

}  // namespace anvil::train
