#include "anvil/dist/data_parallel.hpp"

#include <mpi.h>

namespace anvil::dist {

DataParallelGroup::DataParallelGroup(int ranks_per_node)
    : comm_(std::make_unique<comm::Communicator>(MPI_COMM_WORLD, ranks_per_node)),
      async_(std::make_unique<comm::AsyncCommunicator>(MPI_COMM_WORLD, ranks_per_node)) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
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

}  // namespace anvil::dist
