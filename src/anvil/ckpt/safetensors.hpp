// The safetensors format (Hugging Face): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {string: string}}, then the raw little-endian data.
// anvil writes F32 or BF16 (and reads F32 and BF16, widening BF16 to float), so its
// weights load in Python with the `safetensors` package or a few lines of
// numpy, and Hugging Face checkpoints load here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace anvil::ckpt {

struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
  // Instead of `data`: bfloat16 bits, written as dtype BF16 (exports).
  const uint16_t* bf16 = nullptr;
  // For write_safetensors_filled, which reads neither: dtype BF16 (else F32).
  bool filled_bf16 = false;
  bool is_bf16() const { return bf16 != nullptr || filled_bf16; }
};

// Writes atomically (temporary name, fsync, rename). Tensors keep the given
// order in the data section; the header is sorted by name as the format's
// reference writer does.
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// write_safetensors with O_DIRECT (base/files.hpp), also returning each
// tensor's CRC-32 (base/checksum.hpp), computed as its bytes are copied.
struct WrittenTensor {
  uint64_t begin = 0, end = 0;  // byte range in the file
  uint32_t crc32 = 0;
};
std::vector<WrittenTensor> write_safetensors_direct(
    const std::string& path, const std::vector<TensorRef>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// write_safetensors_direct with the tensors' bytes made on the way rather
// than held (TensorRef's data unused; dtype F32, or BF16 with filled_bf16):
// fill(tensor, at, dst, n) writes bytes [at, at + n) (whole elements) of
// tensors[tensor], called in the file's order. Memory is the writer's
// buffer, whatever the file's size.
std::vector<WrittenTensor> write_safetensors_filled(
    const std::string& path, const std::vector<TensorRef>& tensors,
    const std::map<std::string, std::string>& metadata,
    const std::function<void(size_t tensor, uint64_t at, char* dst, size_t n)>& fill);

struct LoadedTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  std::map<std::string, LoadedTensor> tensors;
  std::map<std::string, std::string> metadata;
  // Throws InputError naming the file and tensor when absent or of another shape.
  const LoadedTensor& get(const std::string& name, const std::vector<int64_t>& shape) const;
  std::string path;
};

// Reads a whole file; throws InputError naming the file on any malformation.
SafetensorsFile read_safetensors(const std::string& path);

struct SafetensorsEntry;
// A file opened for its tensors one at a time: the header is read and
// checked whole at open (the same errors as read_safetensors), a tensor's
// bytes when it is read, so a reader holds one tensor, not the file.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Every tensor's shape, by name.
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  // One tensor's values as floats (BF16 widened); InputError naming the
  // file when it has no such tensor.
  LoadedTensor read(const std::string& name) const;

 private:
  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::shared_ptr<const SafetensorsEntry>> entries_;
  uint64_t data_start_ = 0;
};

}  // namespace anvil::ckpt
