// DeviceCollectives on NCCL, loaded with dlopen when first used: the binary
// carries no NCCL dependency, and the GPU machine's own libnccl.so.2 is the
// one that runs (found through LD_LIBRARY_PATH, or PyTorch's nvidia-nccl wheel
// that scripts/gpu-check.sh adds to it).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#include "anvil/base/error.hpp"
#include "anvil/device/collectives.hpp"
#include "anvil/device/cuda_check.hpp"
#include "anvil/device/dynamic_library.hpp"

namespace anvil::device {
namespace {

struct Nccl {
  std::string error;  // why it could not be loaded; empty when loaded
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

const Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* name = "libnccl.so.2";
    void* lib = open_library(name, n.error);
    if (!lib) return;
    bind_symbol(lib, name, "ncclGetVersion", n.get_version, n.error);
    bind_symbol(lib, name, "ncclGetUniqueId", n.get_unique_id, n.error);
    bind_symbol(lib, name, "ncclCommInitRank", n.init_rank, n.error);
    bind_symbol(lib, name, "ncclCommDestroy", n.destroy, n.error);
    bind_symbol(lib, name, "ncclCommAbort", n.abort, n.error);
    bind_symbol(lib, name, "ncclCommGetAsyncError", n.async_error, n.error);
    bind_symbol(lib, name, "ncclGetErrorString", n.error_string, n.error);
    bind_symbol(lib, name, "ncclAllReduce", n.all_reduce, n.error);
    bind_symbol(lib, name, "ncclReduceScatter", n.reduce_scatter, n.error);
    bind_symbol(lib, name, "ncclAllGather", n.all_gather, n.error);
    bind_symbol(lib, name, "ncclBroadcast", n.broadcast, n.error);
    bind_symbol(lib, name, "ncclReduce", n.reduce, n.error);
    bind_symbol(lib, name, "ncclSend", n.send, n.error);
    bind_symbol(lib, name, "ncclRecv", n.recv, n.error);
    bind_symbol(lib, name, "ncclGroupStart", n.group_start, n.error);
    bind_symbol(lib, name, "ncclGroupEnd", n.group_end, n.error);
  });
  return n;
}

const Nccl& loaded() {
  const Nccl& n = nccl();
  if (!n.error.empty()) throw SystemError("NCCL: " + n.error);
  return n;
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  throw SystemError(std::string(what) + " failed: " + loaded().error_string(r));
}

ncclDataType_t nccl_type(Dtype t) {
  switch (t) {
    case Dtype::fp32:
      return ncclFloat32;
    case Dtype::bf16:
      return ncclBfloat16;
    case Dtype::fp16:
      return ncclFloat16;
    case Dtype::fp64:
      return ncclFloat64;
    case Dtype::int32:
      return ncclInt32;
    case Dtype::int64:
      return ncclInt64;
    default:
      throw InputError("NCCL collectives: no " + anvil::to_string(t) + " type");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::avg:
      return ncclAvg;
  }
  return ncclSum;
}

// ncclGroupStart .. ncclGroupEnd around the calls of one scope: a call
// that throws between them still closes the group (an open group would
// queue every later NCCL call of the thread into it, never launched).
class Group {
 public:
  explicit Group(const Nccl& n) : n_(n) { check_nccl(n.group_start(), "ncclGroupStart"); }
  ~Group() {
    if (open_) n_.group_end();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  void end() {
    open_ = false;
    check_nccl(n_.group_end(), "ncclGroupEnd");
  }

 private:
  const Nccl& n_;
  bool open_ = true;
};

cudaStream_t native(Stream& s) { return static_cast<cudaStream_t>(s.native()); }

void check_blocks(std::span<const size_t> offsets, int world, const char* what) {
  if (offsets.size() != static_cast<size_t>(world) + 1)
    throw InputError(std::string("DeviceCollectives::") + what + ": expected " +
                     std::to_string(world + 1) + " block offsets, got " +
                     std::to_string(offsets.size()));
  for (int p = 0; p < world; ++p)
    if (offsets[p + 1] < offsets[p])
      throw InputError(std::string("DeviceCollectives::") + what +
                       ": expected non-decreasing block offsets");
}

}  // namespace

std::string nccl_version(std::string* why) {
  const Nccl& n = nccl();
  if (!n.error.empty()) {
    if (why) *why = n.error;
    return "";
  }
  int code = 0;
  if (n.get_version(&code) != ncclSuccess) return "";
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z from 2.9 on.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

DeviceCollectives::DeviceCollectives(int rank, int world, int ordinal,
                                     const BroadcastId& broadcast_id)
    : rank_(rank), world_(world) {
  require(DeviceKind::cuda, "--device");
  const Nccl& n = loaded();
  // NCCL refuses two ranks of one communicator on one GPU ("invalid usage"
  // from ncclCommInitRank): say so before it, on every rank of the node.
  // With CUDA_VISIBLE_DEVICES a launcher may give each rank its own GPU, so
  // each sees fewer than the ranks: then only NCCL's refusal tells.
  const int gpus = gpu_count(), local = ranks_on_node();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (world > 1 && local > gpus && visible == nullptr)
    throw InputError("NCCL: " + std::to_string(local) + " ranks on this node share " +
                     std::to_string(gpus) +
                     " GPU(s); expected at most one rank per GPU (mpirun -np <= GPUs per node)");
  cuda::check(cudaSetDevice(ordinal), "cudaSetDevice");
  ncclUniqueId id{};
  if (rank == 0) check_nccl(n.get_unique_id(&id), "ncclGetUniqueId");
  if (world > 1) broadcast_id(&id, sizeof id);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = n.init_rank(&comm, world, id, rank);
  if (r == ncclInvalidUsage)
    throw SystemError("ncclCommInitRank failed: " + std::string(n.error_string(r)) +
                      " (two ranks on one GPU? NCCL needs a GPU of its own for every rank)");
  check_nccl(r, "ncclCommInitRank");
  comm_ = comm;
}

DeviceCollectives::~DeviceCollectives() {
  if (!comm_) return;
  // Destroy waits for the communicator's operations; after an error (one
  // NCCL reports, or an exception unwinding past this object, which may
  // have left a peer's call unmatched) that wait can be forever: abort.
  const Nccl& n = nccl();
  auto* comm = static_cast<ncclComm_t>(comm_);
  ncclResult_t pending = ncclSuccess;
  const bool failed = std::uncaught_exceptions() > 0 ||
                      n.async_error(comm, &pending) != ncclSuccess ||
                      (pending != ncclSuccess && pending != ncclInProgress);
  if (failed)
    n.abort(comm);
  else
    n.destroy(comm);
}

void DeviceCollectives::all_reduce(const void* send, void* recv, size_t count, Dtype type,
                                   ReduceOp op, Stream& stream) {
  check_nccl(loaded().all_reduce(send, recv, count, nccl_type(type), nccl_op(op),
                                 static_cast<ncclComm_t>(comm_), native(stream)),
             "ncclAllReduce");
}

void DeviceCollectives::reduce_scatter(const void* send, void* recv, size_t recv_count,
                                       Dtype type, ReduceOp op, Stream& stream) {
  check_nccl(loaded().reduce_scatter(send, recv, recv_count, nccl_type(type), nccl_op(op),
                                     static_cast<ncclComm_t>(comm_), native(stream)),
             "ncclReduceScatter");
}

void DeviceCollectives::all_gather(const void* send, void* recv, size_t send_count, Dtype type,
                                   Stream& stream) {
  check_nccl(loaded().all_gather(send, recv, send_count, nccl_type(type),
                                 static_cast<ncclComm_t>(comm_), native(stream)),
             "ncclAllGather");
}

void DeviceCollectives::broadcast(const void* send, void* recv, size_t count, Dtype type, int root,
                                  Stream& stream) {
  check_nccl(loaded().broadcast(send, recv, count, nccl_type(type), root,
                                static_cast<ncclComm_t>(comm_), native(stream)),
             "ncclBroadcast");
}

void DeviceCollectives::all_to_all(const void* send, void* recv, size_t count, Dtype type,
                                   Stream& stream) {
  const Nccl& n = loaded();
  const size_t block = count * dtype_bytes(type);
  const ncclDataType_t t = nccl_type(type);
  Group group(n);
  for (int p = 0; p < world_; ++p) {
    const auto* s = static_cast<const char*>(send) + block * static_cast<size_t>(p);
    auto* r = static_cast<char*>(recv) + block * static_cast<size_t>(p);
    check_nccl(n.send(s, count, t, p, static_cast<ncclComm_t>(comm_), native(stream)), "ncclSend");
    check_nccl(n.recv(r, count, t, p, static_cast<ncclComm_t>(comm_), native(stream)), "ncclRecv");
  }
  group.end();
}

// One NCCL group of `call(block, count, rank p)` over the blocks.
template <class Call>
void DeviceCollectives::per_block(void* data, std::span<const size_t> offsets, Dtype type,
                                  const char* what, Call call) {
  check_blocks(offsets, world_, what);
  const Nccl& n = loaded();
  const size_t width = dtype_bytes(type);
  nccl_type(type);  // an unsupported type throws before the group opens
  Group group(n);
  // Every rank has the same offsets, so all skip the same empty blocks.
  for (int p = 0; p < world_; ++p)
    if (offsets[p + 1] > offsets[p])
      call(static_cast<char*>(data) + offsets[p] * width, offsets[p + 1] - offsets[p], p);
  group.end();
}

void DeviceCollectives::reduce_blocks(void* data, std::span<const size_t> offsets, Dtype type,
                                      ReduceOp op, Stream& stream) {
  per_block(data, offsets, type, "reduce_blocks", [&](void* block, size_t count, int root) {
    check_nccl(loaded().reduce(block, block, count, nccl_type(type), nccl_op(op), root,
                               static_cast<ncclComm_t>(comm_), native(stream)),
               "ncclReduce");
  });
}

void DeviceCollectives::broadcast_pieces(void* data, std::span<const Piece> pieces, Dtype type,
                                         Stream& stream) {
  const Nccl& n = loaded();
  const ncclDataType_t t = nccl_type(type);
  const size_t width = dtype_bytes(type);
  Group group(n);
  for (const Piece& p : pieces) {
    void* at = static_cast<char*>(data) + p.offset * width;
    check_nccl(
        n.broadcast(at, at, p.count, t, p.root, static_cast<ncclComm_t>(comm_), native(stream)),
        "ncclBroadcast");
  }
  group.end();
}

void DeviceCollectives::broadcast_blocks(void* data, std::span<const size_t> offsets, Dtype type,
                                         Stream& stream) {
  per_block(data, offsets, type, "broadcast_blocks", [&](void* block, size_t count, int root) {
    check_nccl(loaded().broadcast(block, block, count, nccl_type(type), root,
                                  static_cast<ncclComm_t>(comm_), native(stream)),
               "ncclBroadcast");
  });
}

}  // namespace anvil::device
