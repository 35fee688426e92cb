// `anvil bench comm`'s results as people and machines read them: the text
// tables, CSV and JSON are pinned byte for byte on a fixed result (every op,
// rooted and reducing ones, the mpi baseline and an unchecked point), and the
// bus-bandwidth factors and the tuning table derived from a run are exact.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>

#include "anvil/bench/comm_bench.hpp"

namespace anvil::bench {
namespace {

CommPoint point(const std::string& op, const std::string& algo, int64_t bytes, int64_t count,
                double p50_us, double busbw, int64_t wrong) {
  const double algbw = p50_us > 0 ? static_cast<double>(bytes) / (p50_us * 1e-6) / 1e9 : 0;
  return {op, algo, bytes, count, p50_us, p50_us * 1.5, algbw, busbw, wrong};
}

// Two ranks, bf16 sum, root 1, in place: a point or two of every op.
CommBenchResult sample_result() {
  CommBenchResult r;
  r.ranks = 2;
  r.dtype = "bf16";
  r.redop = "sum";
  r.root = 1;
  r.in_place = true;
  r.points = {point("allreduce", "mpi", 1024, 512, 10.0, 0.1, 0),
              point("allreduce", "shm", 1024, 512, 4.0, 0.25, 0),
              point("allreduce", "mpi", 4096, 2048, 20.0, 0.2, 0),
              point("allreduce", "shm", 4096, 2048, 5.0, 0.8, 0),
              point("reduce_scatter", "mpi", 1024, 512, 9.0, 0.05, 0),
              point("reduce_scatter", "ring", 1024, 512, 12.0, 0.04, -1),
              point("allgather", "mpi", 1024, 512, 8.0, 0.0, 0),
              point("allgather", "ring", 1024, 512, 8.5, 0.06, 0),
              point("broadcast", "mpi", 1024, 512, 7.0, 0.15, 0),
              point("broadcast", "tree", 1024, 512, 6.0, 0.17, 0),
              point("reduce", "mpi", 1024, 512, 7.5, 0.14, 0),
              point("reduce", "shm", 1024, 512, 3.0, 0.34, 2),
              point("alltoall", "mpi", 1024, 256, 11.0, 0.05, 0),
              point("alltoall", "pairwise", 1024, 256, 0.0, 0.0, 0)};
  r.fits = {{"allreduce", "mpi", 9.5, 0.4}, {"allreduce", "shm", 3.25, 1.0}};
  return r;
}

TEST(CommBenchOutput, TextHasOneTablePerOpThenTheFits) {
  EXPECT_EQ(sample_result().text(),
            R"(# allreduce, 2 ranks, bf16, in place; time = slowest rank, busbw in GB/s
size  count  type  redop  root  mpi p50 us  mpi p99 us  mpi algbw  mpi busbw  mpi #wrong  shm p50 us  shm p99 us  shm algbw  shm busbw  shm #wrong  shm x mpi
-------------------------------------------------------------------------------------------------------------------------------------------------------------
1024    512  bf16  sum       -        10.0        15.0       0.10       0.10           0         4.0         6.0       0.26       0.25           0       2.50
4096   2048  bf16  sum       -        20.0        30.0       0.20       0.20           0         5.0         7.5       0.82       0.80           0       4.00

# reduce_scatter, 2 ranks, bf16, in place; time = slowest rank, busbw in GB/s
size  count  type  redop  root  mpi p50 us  mpi p99 us  mpi algbw  mpi busbw  mpi #wrong  ring p50 us  ring p99 us  ring algbw  ring busbw  ring #wrong  ring x mpi
-------------------------------------------------------------------------------------------------------------------------------------------------------------------
1024    512  bf16  sum       -         9.0        13.5       0.11       0.05           0         12.0         18.0        0.09        0.04            -        0.80

# allgather, 2 ranks, bf16, in place; time = slowest rank, busbw in GB/s
size  count  type  redop  root  mpi p50 us  mpi p99 us  mpi algbw  mpi busbw  mpi #wrong  ring p50 us  ring p99 us  ring algbw  ring busbw  ring #wrong  ring x mpi
-------------------------------------------------------------------------------------------------------------------------------------------------------------------
1024    512  bf16  none      -         8.0        12.0       0.13       0.00           0          8.5         12.8        0.12        0.06            0           -

# broadcast, 2 ranks, bf16, in place; time = slowest rank, busbw in GB/s
size  count  type  redop  root  mpi p50 us  mpi p99 us  mpi algbw  mpi busbw  mpi #wrong  tree p50 us  tree p99 us  tree algbw  tree busbw  tree #wrong  tree x mpi
-------------------------------------------------------------------------------------------------------------------------------------------------------------------
1024    512  bf16  none      1         7.0        10.5       0.15       0.15           0          6.0          9.0        0.17        0.17            0        1.13

# reduce, 2 ranks, bf16, in place; time = slowest rank, busbw in GB/s
size  count  type  redop  root  mpi p50 us  mpi p99 us  mpi algbw  mpi busbw  mpi #wrong  shm p50 us  shm p99 us  shm algbw  shm busbw  shm #wrong  shm x mpi
-------------------------------------------------------------------------------------------------------------------------------------------------------------
1024    512  bf16  sum       1         7.5        11.2       0.14       0.14           0         3.0         4.5       0.34       0.34           2       2.43

# alltoall, 2 ranks, bf16, in place; time = slowest rank, busbw in GB/s
size  count  type  redop  root  mpi p50 us  mpi p99 us  mpi algbw  mpi busbw  mpi #wrong  pairwise p50 us  pairwise p99 us  pairwise algbw  pairwise busbw  pairwise #wrong  pairwise x mpi
-------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------
1024    256  bf16  none      -        11.0        16.5       0.09       0.05           0              0.0              0.0            0.00            0.00                0            0.00

alpha-beta fit (time = alpha + bytes / bandwidth):
op         algo  alpha us  bandwidth GB/s
-----------------------------------------
allreduce  mpi       9.50            0.40
allreduce  shm       3.25            1.00
)");
}

TEST(CommBenchOutput, CsvHasOneRowPerPoint) {
  EXPECT_EQ(sample_result().csv(),
            R"(op,algo,size,count,type,redop,root,p50_us,p99_us,algbw,busbw,wrong
allreduce,mpi,1024,512,bf16,sum,-,10.00,15.00,0.102,0.100,0
allreduce,shm,1024,512,bf16,sum,-,4.00,6.00,0.256,0.250,0
allreduce,mpi,4096,2048,bf16,sum,-,20.00,30.00,0.205,0.200,0
allreduce,shm,4096,2048,bf16,sum,-,5.00,7.50,0.819,0.800,0
reduce_scatter,mpi,1024,512,bf16,sum,-,9.00,13.50,0.114,0.050,0
reduce_scatter,ring,1024,512,bf16,sum,-,12.00,18.00,0.085,0.040,-
allgather,mpi,1024,512,bf16,none,-,8.00,12.00,0.128,0.000,0
allgather,ring,1024,512,bf16,none,-,8.50,12.75,0.120,0.060,0
broadcast,mpi,1024,512,bf16,none,1,7.00,10.50,0.146,0.150,0
broadcast,tree,1024,512,bf16,none,1,6.00,9.00,0.171,0.170,0
reduce,mpi,1024,512,bf16,sum,1,7.50,11.25,0.137,0.140,0
reduce,shm,1024,512,bf16,sum,1,3.00,4.50,0.341,0.340,2
alltoall,mpi,1024,256,bf16,none,-,11.00,16.50,0.093,0.050,0
alltoall,pairwise,1024,256,bf16,none,-,0.00,0.00,0.000,0.000,0
)");
}

TEST(CommBenchOutput, JsonHoldsEveryPointAndFit) {
  EXPECT_EQ(
      sample_result().to_json().dump(), R"({"benchmark":"comm","dtype":"bf16","fits":[{"algo":"mpi","alpha_us":9.5,"bandwidth_gbs":0.4,"op":"allreduce"},{"algo":"shm","alpha_us":3.25,"bandwidth_gbs":1.0,"op":"allreduce"}],"in_place":true,"points":[{"algbw_gbs":0.10240000000000002,"algo":"mpi","busbw_gbs":0.1,"bytes":1024,"count":512,"op":"allreduce","p50_us":10.0,"p99_us":15.0,"wrong":0},{"algbw_gbs":0.256,"algo":"shm","busbw_gbs":0.25,"bytes":1024,"count":512,"op":"allreduce","p50_us":4.0,"p99_us":6.0,"wrong":0},{"algbw_gbs":0.20480000000000004,"algo":"mpi","busbw_gbs":0.2,"bytes":4096,"count":2048,"op":"allreduce","p50_us":20.0,"p99_us":30.0,"wrong":0},{"algbw_gbs":0.8192000000000002,"algo":"shm","busbw_gbs":0.8,"bytes":4096,"count":2048,"op":"allreduce","p50_us":5.0,"p99_us":7.5,"wrong":0},{"algbw_gbs":0.11377777777777777,"algo":"mpi","busbw_gbs":0.05,"bytes":1024,"count":512,"op":"reduce_scatter","p50_us":9.0,"p99_us":13.5,"wrong":0},{"algbw_gbs":0.08533333333333333,"algo":"ring","busbw_gbs":0.04,"bytes":1024,"count":512,"op":"reduce_scatter","p50_us":12.0,"p99_us":18.0,"wrong":null},{"algbw_gbs":0.128,"algo":"mpi","busbw_gbs":0.0,"bytes":1024,"count":512,"op":"allgather","p50_us":8.0,"p99_us":12.0,"wrong":0},{"algbw_gbs":0.12047058823529412,"algo":"ring","busbw_gbs":0.06,"bytes":1024,"count":512,"op":"allgather","p50_us":8.5,"p99_us":12.75,"wrong":0},{"algbw_gbs":0.1462857142857143,"algo":"mpi","busbw_gbs":0.15,"bytes":1024,"count":512,"op":"broadcast","p50_us":7.0,"p99_us":10.5,"wrong":0},{"algbw_gbs":0.17066666666666666,"algo":"tree","busbw_gbs":0.17,"bytes":1024,"count":512,"op":"broadcast","p50_us":6.0,"p99_us":9.0,"wrong":0},{"algbw_gbs":0.13653333333333334,"algo":"mpi","busbw_gbs":0.14,"bytes":1024,"count":512,"op":"reduce","p50_us":7.5,"p99_us":11.25,"wrong":0},{"algbw_gbs":0.3413333333333333,"algo":"shm","busbw_gbs":0.34,"bytes":1024,"count":512,"op":"reduce","p50_us":3.0,"p99_us":4.5,"wrong":2},{"algbw_gbs":0.0930909090909091,"algo":"mpi","busbw_gbs":0.05,"bytes":1024,"count":256,"op":"alltoall","p50_us":11.0,"p99_us":16.5,"wrong":0},{"algbw_gbs":0.0,"algo":"pairwise","busbw_gbs":0.0,"bytes":1024,"count":256,"op":"alltoall","p50_us":0.0,"p99_us":0.0,"wrong":0}],"ranks":2,"redop":"sum","registered":false,"root":1})");
}

TEST(CommBenchOutput, BusBandwidthFactorsAreNcclTests) {
  EXPECT_EQ(bus_factor(comm::Op::allreduce, 4), 1.5);
  EXPECT_EQ(bus_factor(comm::Op::reduce_scatter, 4), 0.75);
  EXPECT_EQ(bus_factor(comm::Op::allgather, 4), 0.75);
  EXPECT_EQ(bus_factor(comm::Op::alltoall, 4), 0.75);
  EXPECT_EQ(bus_factor(comm::Op::broadcast, 4), 1.0);
  EXPECT_EQ(bus_factor(comm::Op::reduce, 4), 1.0);
}

TEST(CommBenchOutput, TuningTableTakesTheFastestCheckedAlgorithmPerSize) {
  // auto and wrong points never win; equal winners merge; the last row is open.
  CommBenchResult r;
  r.ranks = 2;
  // Per size: mpi's time, shm's time and shm's wrong count. shm is fastest
  // at 8 and 64 bytes; at 512 it is faster still but wrong.
  const std::tuple<int64_t, double, double, int64_t> sizes[] = {
      {8, 5.0, 2.0, 0}, {64, 6.0, 3.0, 0}, {512, 7.0, 1.0, 3}};
  for (const auto& [bytes, mpi_us, shm_us, shm_wrong] : sizes) {
    r.points.push_back(point("allreduce", "mpi", bytes, bytes / 4, mpi_us, 0, 0));
    r.points.push_back(point("allreduce", "shm", bytes, bytes / 4, shm_us, 0, shm_wrong));
  }
  r.points.push_back(point("allreduce", "auto", 8, 2, 1.0, 0, 0));
  r.points.push_back(point("broadcast", "tree", 8, 2, 1.0, 0, -1));
  const comm::TuningTable t = tuning_from(r);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0].op, comm::Op::allreduce);
  EXPECT_EQ(t.rows[0].algo, comm::Algo::shm);
  EXPECT_EQ(t.rows[0].max_bytes, 64);
  EXPECT_EQ(t.rows[1].algo, comm::Algo::mpi);
  EXPECT_EQ(t.rows[1].max_bytes, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(t.rows[2].op, comm::Op::broadcast);
  EXPECT_EQ(t.rows[2].algo, comm::Algo::tree);
  EXPECT_EQ(t.rows[2].ranks, 2);
}

}  // namespace
}  // namespace anvil::bench
