#include "anvil/base/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "anvil/base/error.hpp"

namespace anvil {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// The temporaries being written, for a signal that ends the process to
// remove: fixed slots (no allocation in the handler), each free (0),
// being filled (1) or holding a path to remove (2).
constexpr int kCleanupSlots = 64;
constexpr size_t kCleanupPath = 4096;
struct CleanupSlot {
  std::atomic<int> state{0};
  std::atomic<uint32_t> generation{0};  // bumped at each arming
  char path[kCleanupPath];
};
CleanupSlot g_cleanup[kCleanupSlots];

extern "C" void remove_temporaries_and_end(int sig) {
  // A slot another thread frees and fills again while this reads it would
  // give a torn path: copied, then used only if the slot still holds it.
  static char path[kCleanupPath];
  for (CleanupSlot& s : g_cleanup) {
    const uint32_t g = s.generation.load();
    if (s.state.load() != 2) continue;
    std::memcpy(path, s.path, kCleanupPath);
    path[kCleanupPath - 1] = '\0';
    if (s.state.load() == 2 && s.generation.load() == g) ::unlink(path);
  }
  ::signal(sig, SIG_DFL);  // then the signal's own action: the process ends
  ::raise(sig);
}

// For each signal whose action is still the default (ending the process),
// remove the temporaries first. A signal someone handles (anvil train
// stopping at a step boundary, anvil launch) is left to its handler, which
// restores this one when it is done.
void handle_ending_signals() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) != 0) continue;
    if ((now.sa_flags & SA_SIGINFO) != 0 || now.sa_handler != SIG_DFL) continue;
    struct sigaction mine {};
    mine.sa_handler = remove_temporaries_and_end;
    sigemptyset(&mine.sa_mask);
    ::sigaction(sig, &mine, nullptr);
  }
}

// A slot holding `path` (-1 when none is free or it is too long: then an
// interrupt leaves it, as before).
int arm_cleanup(const std::string& path) {
  if (path.size() >= kCleanupPath) return -1;
  handle_ending_signals();
  for (int i = 0; i < kCleanupSlots; ++i) {
    int free = 0;
    if (g_cleanup[i].state.compare_exchange_strong(free, 1)) {
      g_cleanup[i].generation.fetch_add(1);
      std::memcpy(g_cleanup[i].path, path.c_str(), path.size() + 1);
      g_cleanup[i].state.store(2);
      return i;
    }
  }
  return -1;
}

void disarm_cleanup(int slot) {
  if (slot >= 0) g_cleanup[slot].state.store(0);
}

// The last steps of an atomic write: the temporary file made durable and
// renamed over `path`; removed on any failure.
void commit_temporary(int fd, const std::string& tmpl, const std::string& path,
                      const std::string& dir) {
  auto fail = [&](const std::string& what) {
    const int err = errno;
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw SystemError(path + ": " + what + ": " + reason, err);
  };
  if (::fchmod(fd, 0644) != 0) fail("chmod failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmpl.c_str());
    throw SystemError(path + ": close failed: " + errno_text(), err);
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const int err = errno;
    const std::string reason = errno_text();
    ::unlink(tmpl.c_str());
    throw SystemError(path + ": rename failed: " + reason, err);
  }
  fsync_directory(dir);
}

}  // namespace

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

namespace {

// mkstemp's template for a temporary sibling of `path`: DIR/.NAME.tmp.XXXXXX.
std::string temporary_template(const std::string& path) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.parent_path();
  return (dir.empty() ? std::string(".") : dir.string()) + "/." + target.filename().string() +
         ".tmp.XXXXXX";
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view contents) {
  write_file_atomic(path, std::vector<std::string_view>{contents});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  AtomicFile file(path);
  for (const auto& contents : pieces) file.write(contents);
  file.commit();
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  // Missing parents are made, as for output directories (output_path_problem
  // checked before the work that they can be).
  std::error_code made;
  if (!dir.empty()) std::filesystem::create_directories(dir, made);
  temporary_ = temporary_template(path);
  fd_ = ::mkstemp(temporary_.data());
  if (fd_ < 0) throw SystemError(path + ": cannot create a temporary file: " + errno_text(), errno);
  slot_ = arm_cleanup(temporary_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {  // not committed
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
  disarm_cleanup(slot_);
}

void AtomicFile::fail(const std::string& what) {
  const int err = errno;
  const std::string reason = errno_text();
  ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.c_str());
  throw SystemError(path_ + ": " + what + ": " + reason, err);
}

void AtomicFile::write(std::string_view bytes) {
  write_at(size_, bytes);
}

void AtomicFile::write_at(uint64_t offset, std::string_view bytes) {
  if (fd_ < 0) throw SystemError(path_ + ": write after the file was committed or failed", EBADF);
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n =
        ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    done += static_cast<size_t>(n);
  }
  size_ = std::max<uint64_t>(size_, offset + bytes.size());
}

void AtomicFile::commit() {
  if (fd_ < 0) throw SystemError(path_ + ": commit after the file was committed or failed", EBADF);
  const int fd = fd_;
  fd_ = -1;  // commit_temporary closes it and removes the temporary on failure
  commit_temporary(fd, temporary_, path_, std::filesystem::path(path_).parent_path().string());
  disarm_cleanup(slot_);
  slot_ = -1;
}

void write_file_atomic_direct(
    const std::string& path, const std::vector<std::string_view>& pieces,
    const std::function<void(size_t piece, const char* bytes, size_t n)>& visit) {
  std::vector<uint64_t> sizes;
  for (const auto& p : pieces) sizes.push_back(p.size());
  write_file_atomic_direct_filled(path, sizes, [&](size_t piece, uint64_t at, char* dst, size_t n) {
    std::memcpy(dst, pieces[piece].data() + at, n);
    if (visit) visit(piece, dst, n);
  });
}

void write_file_atomic_direct_filled(
    const std::string& path, const std::vector<uint64_t>& sizes,
    const std::function<void(size_t piece, uint64_t at, char* dst, size_t n)>& fill) {
  constexpr size_t kAlign = 4096, kBuffer = size_t{16} << 20, kStep = size_t{256} << 10;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::string tmpl = temporary_template(path);
  const int probe = ::mkstemp(tmpl.data());
  if (probe < 0) throw SystemError(path + ": cannot create a temporary file: " + errno_text(), errno);
  ::close(probe);
  struct Disarm {
    int slot;
    ~Disarm() { disarm_cleanup(slot); }
  } cleanup{arm_cleanup(tmpl)};
  const int fd = ::open(tmpl.c_str(), O_WRONLY | O_DIRECT);
  if (fd < 0) {  // no O_DIRECT here (tmpfs): the buffered path, a step at a time
    ::unlink(tmpl.c_str());
    AtomicFile file(path);
    std::vector<char> step(kStep);
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (uint64_t done = 0; done < sizes[i];) {
        const auto n = static_cast<size_t>(std::min<uint64_t>(sizes[i] - done, kStep));
        fill(i, done, step.data(), n);
        file.write({step.data(), n});
        done += n;
      }
    }
    file.commit();
    return;
  }
  // Closed and removed on any way out but the commit: a write that fails, or
  // a fill that throws (a bad source).
  struct CloseUnlessCommitted {
    int fd;
    const std::string& name;
    bool committed = false;
    ~CloseUnlessCommitted() {
      if (!committed) {
        ::close(fd);
        ::unlink(name.c_str());
      }
    }
  } guard{fd, tmpl};
  auto fail = [&](const std::string& what) {
    const int err = errno;
    throw SystemError(path + ": " + what + ": " + errno_text(), err);
  };
  std::unique_ptr<char, decltype(&std::free)> buffer(
      static_cast<char*>(std::aligned_alloc(kAlign, kBuffer)), &std::free);
  if (!buffer) fail("cannot allocate the write buffer");
  size_t used = 0;
  off_t at = 0;
  auto flush = [&](size_t bytes) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t n = ::pwrite(fd, buffer.get() + done, bytes - done, at + static_cast<off_t>(done));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write failed");
      }
      done += static_cast<size_t>(n);
    }
    at += static_cast<off_t>(bytes);
  };
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    total += sizes[i];
    for (uint64_t done = 0; done < sizes[i];) {
      const auto n =
          static_cast<size_t>(std::min<uint64_t>({sizes[i] - done, kStep, kBuffer - used}));
      fill(i, done, buffer.get() + used, n);
      used += n;
      done += n;
      if (used == kBuffer) {
        flush(used);
        used = 0;
      }
    }
  }
  if (used > 0) {  // the tail, padded to the block size, then cut back
    const size_t padded = (used + kAlign - 1) / kAlign * kAlign;
    std::memset(buffer.get() + used, 0, padded - used);
    flush(padded);
  }
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) fail("truncate failed");
  guard.committed = true;  // commit_temporary closes it, and removes it on failure
  commit_temporary(fd, tmpl, path, dir);
}

AppendFile::AppendFile(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
  if (fd_ < 0) throw SystemError(path + ": cannot open for appending: " + errno_text(), errno);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool AppendFile::append(std::string_view record) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    error_ = errno;
    return false;
  }
  const off_t before = st.st_size;
  for (size_t done = 0; done < record.size();) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? errno : ENOSPC;
      if (::ftruncate(fd_, before) != 0) {
      }  // best effort: the record's head goes again
      return false;
    }
    done += static_cast<size_t>(n);
  }
  error_ = 0;
  return true;
}

std::string output_path_problem(const std::string& path, bool dir) {
  namespace fs = std::filesystem;
  if (path.empty()) return "";
  std::error_code ec;
  const fs::path p = fs::absolute(fs::path(path), ec).lexically_normal();
  if (ec) return "cannot resolve the path (" + ec.message() + ")";
  const fs::file_status st = fs::status(p, ec);
  if (fs::exists(st)) {
    if (dir && !fs::is_directory(st)) return "exists and is not a directory";
    if (!dir && fs::is_directory(st)) return "is a directory (expected a file to write)";
  }
  // The directory the output is created in (a file's; a new directory's
  // first existing ancestor), or the existing directory itself.
  fs::path at = dir && fs::exists(st) ? p : p.parent_path();
  while (!at.empty() && at != at.root_path() && !fs::exists(at, ec)) at = at.parent_path();
  if (!fs::is_directory(at, ec)) return at.string() + " is not a directory";
  if (::access(at.c_str(), W_OK) != 0)
    return "cannot write in " + at.string() + " (" + errno_text() + ")";
  return "";
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(path + ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading (" + errno_text() + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace anvil
