#include "anvil/base/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "anvil/base/error.hpp"

namespace anvil {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  write_file_atomic(path, std::vector<std::string_view>{contents});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.parent_path();
  std::string tmpl = (dir.empty() ? std::string(".") : dir.string()) + "/." +
                     target.filename().string() + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) throw SystemError(path + ": cannot create a temporary file: " + errno_text());
  auto fail = [&](const std::string& what) {
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw SystemError(path + ": " + what + ": " + reason);
  };
  for (const auto& contents : pieces) {
    const char* p = contents.data();
    size_t left = contents.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write failed");
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(tmpl.c_str());
    throw SystemError(path + ": close failed: " + errno_text());
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(tmpl.c_str());
    throw SystemError(path + ": rename failed: " + reason);
  }
  fsync_directory(dir.string());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading (" + errno_text() + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace anvil
