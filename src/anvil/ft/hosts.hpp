// The hosts `anvil launch` runs on: from --hosts (h1:2,h2:2), an Open MPI
// hostfile, or Slurm's allocation (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE
// or SLURM_NTASKS), as mpirun's --host list; and the probe that tells a host
// that stopped answering (a link down, a machine gone) from a dead process.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace anvil::ft {

struct Host {
  std::string name;
  int slots = 1;  // ranks on this host
  bool operator==(const Host&) const = default;
};

// "h1:2,h2:2" (a bare name is one slot). Throws InputError naming `what`.
std::vector<Host> parse_hosts(const std::string& text, const std::string& what);

// An Open MPI hostfile: one host per line, "NAME", "NAME slots=N" or
// "NAME:N"; '#' starts a comment. Throws InputError naming the file and line.
std::vector<Host> read_hostfile(const std::string& path);

// Slurm's node list expanded: "gpu[01-03,7],login" -> gpu01 gpu02 gpu03 gpu7
// login (zero padding kept). Throws InputError naming SLURM_JOB_NODELIST.
std::vector<std::string> expand_nodelist(const std::string& list);

// The allocation Slurm describes in `env` (a lookup returning "" when
// unset): the hosts of SLURM_JOB_NODELIST with SLURM_TASKS_PER_NODE's
// counts ("2(x3),1"), or SLURM_NTASKS spread evenly. Empty when
// SLURM_JOB_NODELIST is unset.
std::vector<Host> slurm_hosts(const std::function<std::string(const char*)>& env);

// mpirun's --host value: "h1:2,h2:2".
std::string host_list(const std::vector<Host>& hosts);
int total_slots(const std::vector<Host>& hosts);

// Whether `host` answers a TCP connection to `port` within `timeout_s`: a
// refused connection answers too (the host is up, nothing listens); a
// timeout or an unreachable network does not.
bool host_answers(const std::string& host, int port, double timeout_s);

}  // namespace anvil::ft
