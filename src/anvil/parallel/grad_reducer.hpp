// Data-parallel gradient reduction. The flat gradient arena is cut into
// buckets of `bucket_floats` counted from its end, because backward writes
// the arena from its end towards its start (the last layers' gradients are
// final first; the tied embedding, at offset 0, last). As backward reports
// that every gradient at offset >= X is final (ready_from), each bucket
// wholly above X is handed to the non-blocking collectives, so the
// reduction of late layers overlaps the backward of early ones. finish()
// starts what is left and waits for all of it.
//
// Each bucket is reduce-scattered (sum, in place): rank r ends up owning the
// summed block r of every bucket (owned()). Plain data parallelism then
// all-gathers the bucket, so every rank has every summed gradient; ZeRO-1
// stops there, updates the parameters of its blocks only, and all-gathers
// the updated parameters (gather()). Both sum every element in the same
// order, so --zero and plain DP give the same bits on one node. Across nodes
// plain DP takes the hierarchical all-reduce instead (shm inside a node,
// ring across), and ZeRO's reduce-scatter / all-gather run as rings. Every rank cuts the same
// buckets and starts them in the same order, and every algorithm reduces in
// a fixed order, so runs repeat bit for bit.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "anvil/comm/async.hpp"

namespace anvil::parallel {

struct ReduceTimes {
  double comm_seconds = 0;     // the collectives' own time, on the progress thread
  double exposed_seconds = 0;  // the trainer's wait in finish(): what was not overlapped
  int64_t buckets = 0;
};

// An arena range reduced over another group than the reducer's own: under
// expert parallelism the experts' gradients, summed over the ranks holding
// the same experts (the expert-data-parallel group) only.
struct ReduceRange {
  int64_t begin = 0, end = 0;
  comm::AsyncCommunicator* comm = nullptr;
};

class GradReducer {
 public:
  // scatter_only: reduce-scatter only (ZeRO-1 with AdamW); otherwise
  // reduce-scatter + all-gather. `other`: ascending, disjoint ranges reduced
  // over their own group; no bucket straddles a range's edge.
  GradReducer(comm::AsyncCommunicator& comm, float* grads, int64_t total, int64_t bucket_floats,
              bool scatter_only, comm::Algo algo = comm::Algo::automatic,
              const std::vector<ReduceRange>& other = {});
  // A new reduction: the step's last backward is about to run.
  void begin();
  // Every gradient at offset >= `offset` is final: start each bucket that
  // lies wholly there and has not started.
  void ready_from(int64_t offset);
  // Starts the rest and waits for every bucket; returns this step's times.
  ReduceTimes finish();
  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  // The ranges [begin, end) of the arena this rank owns: block `rank` of
  // every bucket (its rank in the bucket's group), ascending. Over all ranks
  // these cover every element once per group holding it.
  std::vector<std::pair<int64_t, int64_t>> owned() const;
  // All-gathers `data` (an arena like the gradients) bucket by bucket, in
  // place, from each rank's owned blocks; blocking.
  void gather(float* data);

 private:
  struct Bucket {
    int64_t begin, end;
    comm::AsyncCommunicator* comm;
  };
  float* grads_;
  bool scatter_only_;
  comm::Algo algo_;
  std::vector<Bucket> buckets_;  // from the arena's end to its start
  size_t started_ = 0;
  std::vector<comm::CommRequest> requests_;
  std::vector<double> seconds_;  // per bucket, written by the progress thread
};

}  // namespace anvil::parallel
