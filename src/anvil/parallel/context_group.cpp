#include "anvil/parallel/context_group.hpp"

#include <string>
#include <vector>

#include "anvil/base/clock.hpp"
#include "anvil/comm/transport.hpp"

namespace anvil::parallel {

MpiContextGroup::MpiContextGroup(comm::Communicator& comm) : comm_(comm) {
  MPI_Comm_dup(comm.mpi_comm(), &p2p_);
}

MpiContextGroup::~MpiContextGroup() {
  if (p2p_ != MPI_COMM_NULL) MPI_Comm_free(&p2p_);
}

void MpiContextGroup::allgather(const float* send, float* recv, size_t count) {
  comm_.allgather(send, recv, count * static_cast<size_t>(size()), comm::DType::f32,
                  comm::Algo::automatic);
}

void MpiContextGroup::reduce_scatter(const float* send, float* recv, size_t count) {
  comm_.reduce_scatter(send, recv, count * static_cast<size_t>(size()), comm::DType::f32,
                       comm::ReduceOp::sum, comm::Algo::automatic);
}

void MpiContextGroup::exchange(std::span<const Message> sends, std::span<const Message> recvs) {
  std::vector<MPI_Request> requests;
  for (const Message& m : recvs) {
    requests.emplace_back();
    MPI_Irecv(m.data, static_cast<int>(m.count), MPI_FLOAT, m.peer, m.tag, p2p_,
              &requests.back());
  }
  for (const Message& m : sends) {
    requests.emplace_back();
    MPI_Isend(m.data, static_cast<int>(m.count), MPI_FLOAT, m.peer, m.tag, p2p_,
              &requests.back());
  }
  const double deadline = now_seconds() + comm_.timeout();
  int done = 0;
  while (true) {
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (now_seconds() > deadline) {
      std::string peers;
      for (const Message& m : recvs) peers += (peers.empty() ? "" : ", ") + std::to_string(m.peer);
      throw comm::CommTimeout("context parallelism: the halo exchange of context rank " +
                              std::to_string(rank()) + " timed out after " +
                              std::to_string(comm_.timeout()) + " s waiting for context rank(s) " +
                              (peers.empty() ? "none (its sends)" : peers));
    }
  }
}

}  // namespace anvil::parallel
