// anvil launch's hosts: --hosts, hostfiles, Slurm's allocation, the mpirun
// line it builds, and the probe that tells a host that answers from one
// that does not.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "anvil/base/error.hpp"
#include "anvil/ft/hosts.hpp"
#include "anvil/ft/supervisor.hpp"

namespace anvil::ft {
namespace {

TEST(Hosts, ParsesMpirunsHostForm) {
  EXPECT_EQ(parse_hosts("h1:2,h2:2", "--hosts"), (std::vector<Host>{{"h1", 2}, {"h2", 2}}));
  EXPECT_EQ(parse_hosts("10.0.0.1,node-7:8", "--hosts"),
            (std::vector<Host>{{"10.0.0.1", 1}, {"node-7", 8}}));
  EXPECT_EQ(host_list({{"a", 2}, {"b", 1}}), "a:2,b:1");
  EXPECT_EQ(total_slots({{"a", 2}, {"b", 3}}), 5);
  for (const char* bad : {"", "h1:", "h1:0", "h1:x", "h1:2,,h2", "h 1", "h1:2,h1:2", "h1;ls"}) {
    try {
      parse_hosts(bad, "--hosts");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--hosts: ", 0), 0u) << e.what();
    }
  }
}

TEST(Hosts, ReadsAnOpenMpiHostfile) {
  const std::string path = testing::TempDir() + "/hostfile";
  std::ofstream(path) << "# the cluster\nnode1 slots=4\n\nnode2:2  # short form\nnode3\n"
                      << "node4 slots=2 max_slots=8\n";
  EXPECT_EQ(read_hostfile(path),
            (std::vector<Host>{{"node1", 4}, {"node2", 2}, {"node3", 1}, {"node4", 2}}));
  std::ofstream(path) << "node1 slots=4\nnode2 cores=3\n";
  try {
    read_hostfile(path);
    FAIL() << "accepted cores=3";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2: 'cores=3'"), std::string::npos) << e.what();
  }
  std::ofstream(path) << "# nothing\n";
  EXPECT_THROW(read_hostfile(path), InputError);
  EXPECT_THROW(read_hostfile(path + "-missing"), InputError);
}

TEST(Hosts, ExpandsSlurmsNodeList) {
  EXPECT_EQ(expand_nodelist("gpu[01-03,7],login"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu7", "login"}));
  EXPECT_EQ(expand_nodelist("n[8-10]"), (std::vector<std::string>{"n8", "n9", "n10"}));
  for (const char* bad : {"n[3-1]", "n[1-", "[1-2]", "n[a]", "n[1-2]x"})
    EXPECT_THROW(expand_nodelist(bad), InputError) << bad;
  std::map<std::string, std::string> env = {{"SLURM_JOB_NODELIST", "c[1-3]"},
                                            {"SLURM_TASKS_PER_NODE", "2(x2),1"}};
  const auto lookup = [&](const char* k) { return env.count(k) ? env.at(k) : std::string(); };
  EXPECT_EQ(slurm_hosts(lookup), (std::vector<Host>{{"c1", 2}, {"c2", 2}, {"c3", 1}}));
  env.erase("SLURM_TASKS_PER_NODE");
  env["SLURM_NTASKS"] = "6";
  EXPECT_EQ(slurm_hosts(lookup), (std::vector<Host>{{"c1", 2}, {"c2", 2}, {"c3", 2}}));
  env["SLURM_NTASKS"] = "4";  // does not split over 3 nodes
  EXPECT_THROW(slurm_hosts(lookup), InputError);
  env["SLURM_TASKS_PER_NODE"] = "2(x2)";  // 2 counts for 3 nodes
  EXPECT_THROW(slurm_hosts(lookup), InputError);
  env.clear();
  EXPECT_TRUE(slurm_hosts(lookup).empty());
}

TEST(Hosts, AHostAnswersWhenItConnectsOrRefuses) {
  // A listening port connects; a closed one on a live host is refused (up).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  EXPECT_TRUE(host_answers("127.0.0.1", ntohs(a.sin_port), 1));
  ::close(fd);
  EXPECT_TRUE(host_answers("127.0.0.1", ntohs(a.sin_port), 1));  // refused now: still up
  EXPECT_FALSE(host_answers("no-such-host.invalid", 22, 1));
}

TEST(Hosts, LaunchBuildsTheMpirunLineAndChecksTheRankCount) {
  LaunchOptions o;
  o.hosts = {{"h1", 2}, {"h2", 2}};
  o.dry_run = true;
  o.mpirun_args = {"--mca", "btl", "tcp,self"};
  o.train_args = {"--config", "c.json", "-B", "2", "--out", testing::TempDir() + "/dry"};
  const auto r = launch(o);
  EXPECT_NE(r.command.find("mpirun"), std::string::npos) << r.command;
  EXPECT_NE(r.command.find("--host h1:2,h2:2 --map-by slot -np 4 --mca btl tcp,self "),
            std::string::npos)
      << r.command;
  EXPECT_NE(r.command.find(" train --config c.json -B 2 --out "), std::string::npos) << r.command;
  EXPECT_FALSE(std::filesystem::exists(testing::TempDir() + "/dry"));  // a dry run writes nothing
  o.np = 3;
  EXPECT_THROW(launch(o), InputError);
  o.np = 0;
  o.min_ranks = 5;
  EXPECT_THROW(launch(o), InputError);
  EXPECT_EQ(with_value({"-B", "2"}, "-B", "--batch", "4"), (std::vector<std::string>{"-B", "4"}));
  EXPECT_EQ(with_value({"--batch=2"}, "--batch", "-B", "4"),
            (std::vector<std::string>{"--batch=4"}));
}

}  // namespace
}  // namespace anvil::ft
