// Fault injection specs (`--inject KIND@STEP[:RANK][=ARG]`): what parses, and
// one-line errors naming the option and the expected form for what does not.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/base/files.hpp"
#include "anvil/ft/faults.hpp"
#include "anvil/ft/guard.hpp"
#include "anvil/ft/injector.hpp"
#include "anvil/ft/straggler.hpp"
#include "support/input_error.hpp"

namespace anvil::ft {
namespace {

TEST(Faults, InjectionSpecsParseOrNameTheExpectedForm) {
  const Fault k = parse_fault("kill@30:1");
  EXPECT_EQ(k.kind, "kill");
  EXPECT_EQ(k.step, 30);
  EXPECT_EQ(k.rank, 1);
  const Fault s = parse_fault("slow@5=200");
  EXPECT_EQ(s.kind, "slow");
  EXPECT_EQ(s.rank, 0);
  EXPECT_DOUBLE_EQ(s.arg, 200);
  const Fault w = parse_fault("kill-in-save@20:3=5.5");
  EXPECT_EQ(w.kind, "kill-in-save");
  EXPECT_EQ(w.rank, 3);
  EXPECT_DOUBLE_EQ(w.arg, 5.5);
  for (const char* bad : {"kill", "kill@", "kill@0", "boom@3", "kill@3:x", "kill@3:1=", "slow@3",
                          "kill@3x", "nan@-1", "@3", "kill,hang@3", "ill@3", "rank@3",
                          "slow-rank@3=1", "slow-rank@3", "spike@3=1", "spike@3=0.5"}) {
    test_support::expect_input_error(
        [&] { parse_fault(bad); },
        {"faults.inject: ", "KIND@STEP[:RANK][=ARG]", "got '" + std::string(bad) + "'"});
  }
  const Fault d = parse_fault("disk-full@20=10");
  EXPECT_EQ(d.kind, "disk-full");
  EXPECT_DOUBLE_EQ(d.arg, 10);
  EXPECT_EQ(parse_fault("slow-rank@5:1=3").rank, 1);
  EXPECT_EQ(parse_fault("flip-param@15:1").kind, "flip-param");
  EXPECT_EQ(parse_fault("term@4").kind, "term");
  EXPECT_DOUBLE_EQ(parse_fault("spike@6=4").arg, 4);
  EXPECT_DOUBLE_EQ(parse_fault("spike@6").arg, 0);  // the default factor, 10
}

// flip-param flips the top mantissa bit of the first weight, on its rank
// and step only, after that step's update.
TEST(Faults, FlipParamFlipsOneBitOfTheFirstWeightOnItsRankAndStep) {
  InjectOptions o;
  o.inject = "flip-param@3:1";
  std::vector<float> w = {1.0f, 2.0f};
  const auto weights = [&] { return w.data(); };
  Injector(o, 0).step_updated(3, weights);  // another rank
  Injector(o, 1).step_updated(2, weights);  // another step
  EXPECT_EQ(w[0], 1.0f);
  Injector(o, 1).step_updated(3, weights);
  EXPECT_EQ(w[0], 1.5f);  // 1.0 with the top mantissa bit set
  EXPECT_EQ(w[1], 2.0f);
}

// A rank whose compute stays above factor x the others' median is named
// once, on the straggler_steps-th slow step in a row; a fast step resets it.
TEST(Stragglers, ASlowRankIsNamedOnceAfterItsRunOfSlowSteps) {
  StragglerWatch watch(2.0, 3);
  EXPECT_FALSE(watch.feed(1, {0.010, 0.011, 0.010, 0.012}));
  EXPECT_FALSE(watch.feed(2, {0.010, 0.035, 0.010, 0.012}));
  EXPECT_FALSE(watch.feed(3, {0.010, 0.033, 0.011, 0.012}));
  const auto s = watch.feed(4, {0.010, 0.030, 0.011, 0.012});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 1);
  EXPECT_EQ(s->since_step, 2);
  EXPECT_DOUBLE_EQ(s->others_median_s, 0.011);
  EXPECT_FALSE(watch.feed(5, {0.010, 0.030, 0.011, 0.012}));  // named once
  EXPECT_FALSE(watch.feed(6, {0.010, 0.012, 0.011, 0.012}));  // recovered
  // Two ranks: each is compared with the other alone.
  StragglerWatch two(2.0, 2);
  EXPECT_FALSE(two.feed(1, {0.030, 0.010}));
  ASSERT_TRUE(two.feed(2, {0.030, 0.010}));
  // Off, or one rank: nothing to compare.
  StragglerWatch off(0, 1);
  EXPECT_FALSE(off.feed(1, {0.1, 0.01}));
  EXPECT_FALSE(StragglerWatch(2.0, 1).feed(1, {0.1}));
}

// A heartbeat that cannot be written whole (a full disk; here a file-size
// limit) leaves the last one in place: an empty file would read as a rank
// that never started, which anvil launch takes for a hang.
TEST(Faults, AHeartbeatNotWrittenWholeLeavesTheLastOne) {
  const std::string dir = testing::TempDir() + "/heartbeat_full";
  std::filesystem::remove_all(dir);
  GuardOptions o;
  o.heartbeat = dir;
  const FaultGuard guard(o, 0, false);
  guard.heartbeat(7, 2.5);
  const std::string beat = read_file(dir + "/rank-0");
  ASSERT_EQ(beat.rfind("7 ", 0), 0u) << beat;
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit none = old;
  none.rlim_cur = 0;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &none), 0);
  guard.heartbeat(8, 2.4);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(read_file(dir + "/rank-0"), beat);
  EXPECT_FALSE(std::filesystem::exists(dir + "/rank-0.tmp"));
  guard.heartbeat(9, 2.3);
  EXPECT_EQ(read_file(dir + "/rank-0").rfind("9 ", 0), 0u);
}

}  // namespace
}  // namespace anvil::ft
