#include "anvil/device/stream_kernels.hpp"

#include "anvil/base/error.hpp"
#include "anvil/device/cuda_backend.hpp"

namespace anvil::device::stream {

void run_device_passes(Stream& stream, Kernel kernel, double* a, double* b, double* c, int64_t n,
                       int passes, double* sink) {
  if (stream.kind() != DeviceKind::cuda)
    throw InputError("membw: device passes run on a CUDA stream; the CPU's are bench membw's");
  if (n % 2 != 0) throw InputError("membw: device passes take an even element count");
  cuda::stream_passes(kernel, a, b, c, n, passes, sink, stream.native());
}

Kernel parse_kernel(const std::string& name, const std::string& flag) {
  for (Kernel k : {Kernel::copy, Kernel::scale, Kernel::add, Kernel::triad, Kernel::read,
                   Kernel::write})
    if (to_string(k) == name) return k;
  throw InputError(flag + ": expected copy, scale, add, triad, read or write, got '" + name + "'");
}

std::string to_string(Kernel k) {
  switch (k) {
    case Kernel::copy:
      return "copy";
    case Kernel::scale:
      return "scale";
    case Kernel::add:
      return "add";
    case Kernel::triad:
      return "triad";
    case Kernel::read:
      return "read";
    case Kernel::write:
      return "write";
  }
  return "?";
}

}  // namespace anvil::device::stream
