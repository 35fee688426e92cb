#include "anvil/parallel/data_parallel.hpp"

#include <mpi.h>

#include <stdexcept>
#include <string>

#include "anvil/base/error.hpp"

namespace anvil::parallel {

DataParallelGroup::DataParallelGroup(int ranks_per_node)
    : comm_(std::make_unique<comm::Communicator>(MPI_COMM_WORLD, ranks_per_node)),
      async_(std::make_unique<comm::AsyncCommunicator>(MPI_COMM_WORLD, ranks_per_node)) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

DataParallelGroup::~DataParallelGroup() {
  expert_data_async_.reset();
  expert_data_.reset();
  expert_.reset();
  for (auto& [cp, context] : contexts_) {
    context.comm.reset();
    if (context.mpi != MPI_COMM_NULL) MPI_Comm_free(&context.mpi);
  }
  if (expert_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&expert_mpi_);
  if (expert_data_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&expert_data_mpi_);
}

comm::Communicator& DataParallelGroup::expert_group(int ep) {
  if (!expert_) {
    if (ep < 1 || size() % ep != 0) {
      throw InputError("--ep: " + std::to_string(ep) + " does not divide the " +
                       std::to_string(size()) + " ranks (expected a divisor of the rank count)");
    }
    MPI_Comm_split(MPI_COMM_WORLD, rank() / ep, rank(), &expert_mpi_);
    expert_ = std::make_unique<comm::Communicator>(expert_mpi_);
    MPI_Comm_split(MPI_COMM_WORLD, rank() % ep, rank(), &expert_data_mpi_);
    // Its nodes are the real ones: --ranks-per-node counts consecutive world
    // ranks, which this group's members are not.
    expert_data_ = std::make_unique<comm::Communicator>(expert_data_mpi_);
    expert_data_async_ = std::make_unique<comm::AsyncCommunicator>(expert_data_mpi_);
  }
  return *expert_;
}

comm::Communicator& DataParallelGroup::context_group(int cp) {
  Context& context = contexts_[cp];
  if (!context.comm) {
    if (cp < 1 || size() % cp != 0) {
      contexts_.erase(cp);
      throw InputError("parallel.cp: " + std::to_string(cp) + " does not divide the " +
                       std::to_string(size()) + " ranks (expected a divisor of the rank count)");
    }
    MPI_Comm mpi = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank() / cp, rank(), &mpi);
    try {
      context.comm = std::make_unique<comm::Communicator>(mpi);
    } catch (...) {
      MPI_Comm_free(&mpi);
      contexts_.erase(cp);
      throw;
    }
    context.mpi = mpi;
  }
  return *context.comm;
}

comm::Communicator& DataParallelGroup::expert_data_group() {
  if (!expert_data_) throw std::logic_error("expert_data_group before expert_group");
  return *expert_data_;
}

comm::AsyncCommunicator& DataParallelGroup::expert_data_async() {
  if (!expert_data_async_) throw std::logic_error("expert_data_async before expert_group");
  return *expert_data_async_;
}

void DataParallelGroup::sum(std::span<double> values) {
  if (values.empty()) return;
  comm_->allreduce(values.data(), values.data(), values.size(), comm::DType::f64,
                   comm::ReduceOp::sum, comm::Algo::automatic);
}

void DataParallelGroup::sum(std::span<int64_t> values) {
  if (values.empty()) return;
  comm_->allreduce(values.data(), values.data(), values.size(), comm::DType::i64,
                   comm::ReduceOp::sum, comm::Algo::automatic);
}

std::vector<double> DataParallelGroup::gather(double value) {
  std::vector<double> all(static_cast<size_t>(size()));
  all[static_cast<size_t>(rank())] = value;
  comm_->allgather(&all[static_cast<size_t>(rank())], all.data(), all.size(), comm::DType::f64,
                   comm::Algo::automatic);
  return all;
}

}  // namespace anvil::parallel
