// The CUDA side of the seam in a build without CUDA (ANVIL_CUDA=off, or no
// nvcc): every device call fails with the same one-line reason, and
// cuda_unavailable_reason() says it before anything is tried.
#include "anvil/base/error.hpp"
#include "anvil/device/collectives.hpp"
#include "anvil/device/cuda_backend.hpp"
#include "anvil/device/gemm_engine.hpp"

namespace anvil::device {
namespace cuda {
namespace {

const char* kReason = "this anvil was built without CUDA (ANVIL_CUDA=off, or no nvcc at build time)";

[[noreturn]] void absent() { throw SystemError(kReason); }

}  // namespace

bool built() { return false; }
std::string unavailable_reason() { return kReason; }
int device_count() { return 0; }
void select(int) { absent(); }
GpuProperties properties(int) { absent(); }
void memory_info(int64_t*, int64_t*) {
  absent();
}
void* allocate(size_t, const std::string&) { absent(); }
void release(void*) {}
void* allocate_pinned(size_t, const std::string&) {
  absent();
}
void release_pinned(void*) {}
void copy(void*, const void*, size_t, CopyKind, void*) { absent(); }
void zero(void*, size_t, void*) { absent(); }
void* stream_create() { absent(); }
void stream_destroy(void*) {}
void stream_synchronize(void*) { absent(); }
void* event_create() { absent(); }
void event_destroy(void*) {}
void event_record(void*, void*) { absent(); }
void event_synchronize(void*) { absent(); }
void stream_wait_event(void*, void*) {
  absent();
}
double event_elapsed_ms(void*, void*) { absent(); }
void stream_passes(stream::Kernel, double*, double*, double*, int64_t, int, double*, void*) {
  absent();
}
std::unique_ptr<GemmEngine> make_cublaslt_engine() { absent(); }
void encode_narrow(const float*, size_t, Dtype, unsigned char*) { absent(); }
void decode_narrow(const unsigned char*, size_t, Dtype, float*) { absent(); }

}  // namespace cuda

std::string nccl_version(std::string* why) {
  if (why) *why = cuda::kReason;
  return "";
}

DeviceCollectives::DeviceCollectives(int rank, int world, int, const BroadcastId&)
    : rank_(rank), world_(world) {
  cuda::absent();
}
DeviceCollectives::~DeviceCollectives() = default;
void DeviceCollectives::all_reduce(const void*, void*, size_t, Dtype, ReduceOp, Stream&) {
  cuda::absent();
}
void DeviceCollectives::reduce_scatter(const void*, void*, size_t, Dtype, ReduceOp, Stream&) {
  cuda::absent();
}
void DeviceCollectives::all_gather(const void*, void*, size_t, Dtype, Stream&) { cuda::absent(); }
void DeviceCollectives::broadcast(const void*, void*, size_t, Dtype, int, Stream&) {
  cuda::absent();
}
void DeviceCollectives::all_to_all(const void*, void*, size_t, Dtype, Stream&) { cuda::absent(); }
void DeviceCollectives::reduce_blocks(void*, std::span<const size_t>, Dtype, ReduceOp, Stream&) {
  cuda::absent();
}
void DeviceCollectives::broadcast_pieces(void*, std::span<const Piece>, Dtype, Stream&) {
  cuda::absent();
}
void DeviceCollectives::broadcast_blocks(void*, std::span<const size_t>, Dtype, Stream&) {
  cuda::absent();
}

}  // namespace anvil::device
