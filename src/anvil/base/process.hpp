// A child process spoken to line by line over its stdin and stdout. Used
// where a measurement must happen in a process with another environment
// (e.g. a BLAS library loaded with another core type than ours) yet be
// interleaved with our own measurements, so machine noise hits both alike.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace anvil {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with our environment changed by `env`: a value
  // sets the variable, an empty value removes it. stderr passes through.
  ChildProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  void send_line(const std::string& line);
  // The next line of the child's stdout, without the newline. Throws
  // SystemError naming the program if it ended first.
  std::string read_line();
  // Closes the child's stdin and waits; returns its exit status (-1: signal).
  int finish();

 private:
  std::string program_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
};

// The path of the running executable (/proc/self/exe resolved).
std::string self_executable();

}  // namespace anvil
