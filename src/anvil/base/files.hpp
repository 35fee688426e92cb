// Files that are either whole or absent: write to a temporary name in the
// same directory, fsync, rename over the target, fsync the directory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

// Replaces `path` atomically with `contents`. Throws SystemError naming the
// path on failure and leaves no temporary file behind.
void write_file_atomic(const std::string& path, std::string_view contents);
// The same, for contents given as pieces (written in order, never copied).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// The same, written with O_DIRECT through an aligned bounce buffer where
// the file system allows it (else as above): the page cache is bypassed,
// which on the 2-core AMD EPYC VMs (Zen 4 and 5, 2026-12) cut the kernel
// CPU of a 1.3 GB write from ~4.5 s to ~0.2 s. `visit(piece, bytes, n)` sees every piece's bytes in
// order as they are copied (checksums in the same pass, while the bytes
// are in cache).
void write_file_atomic_direct(
    const std::string& path, const std::vector<std::string_view>& pieces,
    const std::function<void(size_t piece, const char* bytes, size_t n)>& visit = {});
// The same with the bytes made on the way instead of held: piece i is
// sizes[i] bytes, and fill(i, at, dst, n) writes its bytes [at, at + n)
// into dst, called in order and at most 256 KiB at a time. Memory is the bounce
// buffer, whatever the file's size (a checkpoint reshaped without holding it).
void write_file_atomic_direct_filled(
    const std::string& path, const std::vector<uint64_t>& sizes,
    const std::function<void(size_t piece, uint64_t at, char* dst, size_t n)>& fill);

// Makes a rename or a new file in `dir` durable (best effort).
void fsync_directory(const std::string& dir);

// A file written in parts and then made `path` atomically: written to a
// temporary sibling, which commit() makes durable and renames over `path`.
// Destroyed without commit() (an error on the way), it removes the
// temporary. Every atomic write here (write_file_atomic too) registers its
// temporary while it exists: a SIGINT, SIGTERM or SIGHUP whose action is to
// end the process removes them first, so an interrupted command leaves no
// full-size hidden file behind.
class AtomicFile {
 public:
  // Creates the temporary (and `path`'s missing parent directories);
  // SystemError naming `path` on failure.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Appends `bytes`; SystemError naming `path` on failure.
  void write(std::string_view bytes);
  // Overwrites `bytes` at `offset` (a header patched at the end).
  void write_at(uint64_t offset, std::string_view bytes);
  uint64_t size() const { return size_; }
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what);
  std::string path_, temporary_;
  int fd_ = -1;
  int slot_ = -1;  // its place in the signal-time cleanup (-1: none)
  uint64_t size_ = 0;
};

// A file that grows by whole records (metrics.jsonl, journals): each record
// is appended with O_APPEND writes, and one that fails part-way (a full
// disk) is cut back off, so a reader never sees half a record.
class AppendFile {
 public:
  // Opens (creates) `path`; SystemError naming it on failure.
  explicit AppendFile(const std::string& path);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  // True when `record` was written whole; else nothing of it stays and
  // error() is the errno (ENOSPC: the disk is full).
  bool append(std::string_view record);
  int error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int error_ = 0;
};

// Why `path` cannot be written as a directory (`dir`) or as a file replaced
// atomically, or "" when it can (or is empty): it must be of that kind or
// absent, and its nearest existing ancestor a directory this process may
// write in. Commands check their outputs with it before any work.
std::string output_path_problem(const std::string& path, bool dir);

// Reads a whole file. Throws InputError naming the path if it cannot be read.
std::string read_file(const std::string& path);

}  // namespace anvil
