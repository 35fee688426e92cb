// Running the anvil binary as a user does, for the command-line tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace anvil::test_support {

// An empty directory under the test's temporary directory.
inline std::string fresh_dir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct CliRun {
  int status = -1;
  std::string out;  // stdout or stderr, as asked
};

// Runs `anvil ARGS`; captures stderr when `want_stderr`, else stdout.
inline CliRun run_anvil(const std::string& args, bool want_stderr) {
  // `timeout`: a hang fails the test instead of stalling CI.
  // Appended piece by piece: GCC 12 warns (-Warray-bounds, wrongly) on one long sum.
  std::string cmd = "timeout 300 ";
  cmd += ANVIL_BINARY;
  cmd += ' ';
  cmd += args;
  cmd += want_stderr ? " 2>&1 >/dev/null" : " 2>/dev/null";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline void expect_usage_error(const std::string& args, const std::string& must_name) {
  const CliRun r = run_anvil(args, true);
  EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
  EXPECT_EQ(r.out.rfind("anvil: error: ", 0), 0u) << args << ": " << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": not one line: " << r.out;
  EXPECT_NE(r.out.find(must_name), std::string::npos)
      << args << ": does not name " << must_name << ": " << r.out;
}

}  // namespace anvil::test_support
