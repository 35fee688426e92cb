// Runs a child process and captures its standard output. Used where a
// measurement must happen in a process with a different environment (e.g. a
// BLAS library loaded with another core type than ours).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace anvil {

struct ChildResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;     // standard output
};

// Runs argv[0] (a path) with our environment changed by `env`: a value sets
// the variable, an empty value removes it. stderr passes through.
ChildResult run_child(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env);

// The path of the running executable (/proc/self/exe resolved).
std::string self_executable();

}  // namespace anvil
