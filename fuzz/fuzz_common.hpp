// Shared by the fuzz harnesses: the readers under test take paths, so each
// input is written to a file on tmpfs first. Only anvil's own errors
// (InputError and its subclasses) are expected; anything else, a crash or a
// sanitizer report is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace anvil::fuzz {

inline std::string scratch_dir() {
  static const std::string dir = [] {
    std::string d = "/dev/shm/anvil-fuzz-" + std::to_string(::getpid());
    std::string cmd = "mkdir -p " + d;
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  return dir;
}

inline void put(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

}  // namespace anvil::fuzz
