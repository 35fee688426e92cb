// The memory-bandwidth kernels on CUDA: grid-stride loops over 16-byte
// (double2) loads and stores, each element through stream_kernels.hpp's
// bodies, which the CPU tests also run. Launch wrappers only below.
#include <algorithm>

#include "anvil/device/cuda_backend.hpp"
#include "anvil/device/cuda_check.hpp"
#include "anvil/device/gpu_compat.hpp"
#include "anvil/device/stream_kernels.hpp"

namespace anvil::device::cuda {
namespace {

namespace st = anvil::device::stream;

__global__ void copy_kernel(const double2* a, double2* c, int64_t n2) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n2;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double2 v = a[i];
    c[i] = make_double2(st::copy(v.x), st::copy(v.y));
  }
}

__global__ void scale_kernel(const double2* c, double2* b, int64_t n2, double s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n2;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double2 v = c[i];
    b[i] = make_double2(st::scale(v.x, s), st::scale(v.y, s));
  }
}

__global__ void add_kernel(const double2* a, const double2* b, double2* c, int64_t n2) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n2;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double2 x = a[i], y = b[i];
    c[i] = make_double2(st::add(x.x, y.x), st::add(x.y, y.y));
  }
}

__global__ void triad_kernel(double2* a, const double2* b, const double2* c, int64_t n2,
                             double s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n2;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double2 x = b[i], y = c[i];
    a[i] = make_double2(st::triad(x.x, y.x, s), st::triad(x.y, y.y, s));
  }
}

__global__ void read_kernel(const double2* a, int64_t n2, double* sink) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n2;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double2 v = a[i];
    acc = st::read(st::read(acc, v.x), v.y);
  }
  // Written only when it cannot happen (the data are finite), so the loads
  // are not dead code and nothing is stored per thread.
  if (acc == -1.0) *sink = acc;
}

__global__ void write_kernel(double2* a, int64_t n2, double s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n2;
       i += int64_t{gridDim.x} * blockDim.x) {
    a[i] = make_double2(st::write(s), st::write(s));
  }
}

}  // namespace

void stream_passes(stream::Kernel kernel, double* a, double* b, double* c, int64_t n, int passes,
                   double* sink, void* stream) {
  const int64_t n2 = n / 2;  // callers pass an even n
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const int threads = 256;
  // Enough blocks to fill every SM several times over, no more than the data.
  const int64_t want = std::max<int64_t>(1, (n2 + threads - 1) / threads);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(want, int64_t{sms} * 8));
  auto s = static_cast<cudaStream_t>(stream);
  auto* a2 = reinterpret_cast<double2*>(a);
  auto* b2 = reinterpret_cast<double2*>(b);
  auto* c2 = reinterpret_cast<double2*>(c);
  for (int p = 0; p < passes; ++p) {
    switch (kernel) {
      case stream::Kernel::copy:
        copy_kernel<<<blocks, threads, 0, s>>>(a2, c2, n2);
        break;
      case stream::Kernel::scale:
        scale_kernel<<<blocks, threads, 0, s>>>(c2, b2, n2, stream::kScalar);
        break;
      case stream::Kernel::add:
        add_kernel<<<blocks, threads, 0, s>>>(a2, b2, c2, n2);
        break;
      case stream::Kernel::triad:
        triad_kernel<<<blocks, threads, 0, s>>>(a2, b2, c2, n2, stream::kScalar);
        break;
      case stream::Kernel::read:
        read_kernel<<<blocks, threads, 0, s>>>(a2, n2, sink);
        break;
      case stream::Kernel::write:
        write_kernel<<<blocks, threads, 0, s>>>(a2, n2, stream::kScalar);
        break;
    }
  }
  check(cudaGetLastError(), "membw kernel launch");
}

}  // namespace anvil::device::cuda
