#include "anvil/ft/hosts.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "anvil/base/error.hpp"

namespace anvil::ft {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// A whole decimal number in [lo, hi]; false otherwise.
bool parse_int(const std::string& s, int lo, int hi, int& v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size() && v >= lo && v <= hi;
}

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (const char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_'))
      return false;
  return true;
}

// Splits at commas outside brackets.
std::vector<std::string> split_top(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (const char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

}  // namespace

std::vector<Host> parse_hosts(const std::string& text, const std::string& what) {
  std::vector<Host> hosts;
  for (const auto& item : split_top(text)) {
    Host h;
    const auto colon = item.find(':');
    h.name = item.substr(0, colon);
    if (!valid_name(h.name) ||
        (colon != std::string::npos && !parse_int(item.substr(colon + 1), 1, 4096, h.slots)))
      throw InputError(what + ": '" + item + "' (expected HOST or HOST:RANKS, e.g. h1:2,h2:2)");
    for (const auto& other : hosts)
      if (other.name == h.name) throw InputError(what + ": host " + h.name + " listed twice");
    hosts.push_back(h);
  }
  return hosts;
}

std::vector<Host> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InputError("--hostfile: " + path + ": cannot open");
  std::vector<Host> hosts;
  int line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = "--hostfile: " + path + ":" + std::to_string(line_no);
    std::istringstream words(line);
    std::string name, word;
    words >> name;
    Host h;
    if (const auto colon = name.find(':'); colon != std::string::npos) {
      h = parse_hosts(name, where).front();
    } else {
      h.name = name;
    }
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0 && parse_int(word.substr(6), 1, 4096, h.slots)) continue;
      if (word.rfind("max_slots=", 0) == 0) continue;  // Open MPI's cap; the slots are what we use
      throw InputError(where + ": '" + word + "' (expected slots=N)");
    }
    if (!valid_name(h.name)) throw InputError(where + ": '" + name + "' is not a host name");
    for (const auto& other : hosts)
      if (other.name == h.name) throw InputError(where + ": host " + h.name + " listed twice");
    hosts.push_back(h);
  }
  if (hosts.empty()) throw InputError("--hostfile: " + path + ": no hosts");
  return hosts;
}

std::vector<std::string> expand_nodelist(const std::string& list) {
  const std::string what = "SLURM_JOB_NODELIST";
  std::vector<std::string> names;
  for (const auto& item : split_top(list)) {
    const auto open = item.find('[');
    if (open == std::string::npos) {
      if (!valid_name(item)) throw InputError(what + ": '" + item + "' is not a host name");
      names.push_back(item);
      continue;
    }
    const auto close = item.find(']', open);
    if (close == std::string::npos || close + 1 != item.size() || open == 0)
      throw InputError(what + ": '" + item + "' (expected PREFIX[1-3,7])");
    const std::string prefix = item.substr(0, open);
    for (const auto& range : split_top(item.substr(open + 1, close - open - 1))) {
      const auto dash = range.find('-');
      const std::string a = range.substr(0, dash), b = dash == std::string::npos ? a : range.substr(dash + 1);
      int lo = 0, hi = 0;
      if (!parse_int(a, 0, 99'999'999, lo) || !parse_int(b, lo, 99'999'999, hi) || hi - lo > 100'000)
        throw InputError(what + ": '" + range + "' in '" + item + "' (expected N or N-M, N <= M)");
      for (int n = lo; n <= hi; ++n) {
        std::string digits = std::to_string(n);
        if (digits.size() < a.size()) digits.insert(0, a.size() - digits.size(), '0');
        names.push_back(prefix + digits);
      }
    }
  }
  return names;
}

std::vector<Host> slurm_hosts(const std::function<std::string(const char*)>& env) {
  const std::string list = env("SLURM_JOB_NODELIST");
  if (list.empty()) return {};
  const auto names = expand_nodelist(list);
  std::vector<int> counts;
  if (const std::string per = env("SLURM_TASKS_PER_NODE"); !per.empty()) {
    for (const auto& item : split_top(per)) {  // "2(x3)" is 2, three times
      const auto paren = item.find("(x");
      int n = 0, times = 1;
      if (!parse_int(item.substr(0, paren), 1, 4096, n) ||
          (paren != std::string::npos &&
           (item.back() != ')' ||
            !parse_int(item.substr(paren + 2, item.size() - paren - 3), 1, 100'000, times))))
        throw InputError("SLURM_TASKS_PER_NODE: '" + item + "' (expected N or N(xM))");
      counts.insert(counts.end(), static_cast<size_t>(times), n);
    }
  } else if (const std::string tasks = env("SLURM_NTASKS"); !tasks.empty()) {
    int n = 0;
    if (!parse_int(tasks, 1, 1 << 24, n) || n % static_cast<int>(names.size()) != 0)
      throw InputError("SLURM_NTASKS: '" + tasks + "' (expected a multiple of the " +
                       std::to_string(names.size()) + " nodes of SLURM_JOB_NODELIST)");
    counts.assign(names.size(), n / static_cast<int>(names.size()));
  } else {
    counts.assign(names.size(), 1);
  }
  if (counts.size() != names.size())
    throw InputError("SLURM_TASKS_PER_NODE: " + std::to_string(counts.size()) + " counts for the " +
                     std::to_string(names.size()) + " nodes of SLURM_JOB_NODELIST");
  std::vector<Host> hosts;
  for (size_t i = 0; i < names.size(); ++i) hosts.push_back({names[i], counts[i]});
  return hosts;
}

std::string host_list(const std::vector<Host>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += (s.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return s;
}

int total_slots(const std::vector<Host>& hosts) {
  int n = 0;
  for (const auto& h : hosts) n += h.slots;
  return n;
}

bool host_answers(const std::string& host, int port, double timeout_s) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool answered = false;
  for (addrinfo* a = found; a && !answered; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc == 0 || errno == ECONNREFUSED) {
      answered = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(std::lround(timeout_s * 1000))) == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        answered = err == 0 || err == ECONNREFUSED;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return answered;
}

}  // namespace anvil::ft
