#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("anvil-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(AtomicWrite, CreatesAndReplacesWithoutLeavingTemporaries) {
  const fs::path d = fresh_dir("atomic");
  const std::string p = (d / "out.json").string();
  write_file_atomic(p, "first");
  write_file_atomic(p, "second");
  EXPECT_EQ(read_file(p), "second");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(d)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  fs::remove_all(d);
}

// A missing parent directory is made (as for output directories); a parent
// that cannot be one (a file) fails, naming the path, leaving nothing.
TEST(AtomicWrite, FailureNamesThePathAndLeavesNothing) {
  const fs::path d = fresh_dir("missing");
  const std::string made = (d / "no-such-dir" / "out.json").string();
  write_file_atomic(made, "x");
  EXPECT_EQ(read_file(made), "x");
  write_file_atomic((d / "a-file").string(), "y");
  const std::string p = (d / "a-file" / "out.json").string();
  try {
    write_file_atomic(p, "x");
    FAIL() << "expected an error";
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(p));
  std::vector<std::string> left;  // no temporary file behind
  for (const auto& e : fs::directory_iterator(d)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"a-file", "no-such-dir"}));
  fs::remove_all(d);
}

// Written in parts: nothing at the path until commit, the whole file after;
// a header patched at the end; destroyed uncommitted, nothing left.
TEST(AtomicWrite, AFileWrittenInPartsAppearsWholeOnCommit) {
  const fs::path dir = fs::path(testing::TempDir()) / "atomic_parts";
  fs::remove_all(dir);
  const std::string path = (dir / "out.bin").string();
  {
    AtomicFile f(path);
    f.write("....");
    f.write("body");
    f.write_at(0, "HEAD");
    EXPECT_EQ(f.size(), 8u);
    EXPECT_FALSE(fs::exists(path));
    f.commit();
  }
  EXPECT_EQ(read_file(path), "HEADbody");
  {
    AtomicFile f(path);
    f.write("never");
  }  // no commit: the old file stays
  EXPECT_EQ(read_file(path), "HEADbody");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

// A file made on the way (write_file_atomic_direct_filled): pieces past the
// 16 MiB write buffer and of sizes that are no multiple of a block come back
// byte for byte, each piece's bytes asked for in order; a fill that throws
// leaves neither the file nor a temporary. Written with O_DIRECT on the test
// directory's file system and buffered on tmpfs (no O_DIRECT there).
TEST(AtomicWrite, AFileFilledOnTheWayIsWholeOrAbsent) {
  std::vector<fs::path> dirs{fresh_dir("filled")};
  if (fs::is_directory("/dev/shm")) {
    dirs.push_back(fs::path("/dev/shm") / ("anvil-test-filled-" + std::to_string(::getpid())));
    fs::remove_all(dirs.back());
    fs::create_directories(dirs.back());
  }
  const std::vector<uint64_t> sizes{13, (uint64_t{17} << 20) + 5, 0, 4099};
  auto byte_of = [](size_t piece, uint64_t i) {
    return static_cast<char>((piece * 131 + i * 7) % 251);
  };
  for (const fs::path& d : dirs) {
    SCOPED_TRACE(d.string());
    const std::string path = (d / "out.bin").string();
    std::vector<uint64_t> done(sizes.size(), 0);
    write_file_atomic_direct_filled(path, sizes,
                                    [&](size_t piece, uint64_t at, char* dst, size_t n) {
                                      EXPECT_EQ(at, done[piece]);
                                      for (size_t k = 0; k < n; ++k)
                                        dst[k] = byte_of(piece, at + k);
                                      done[piece] += n;
                                    });
    EXPECT_EQ(done, sizes);
    const std::string back = read_file(path);
    ASSERT_EQ(back.size(), sizes[0] + sizes[1] + sizes[2] + sizes[3]);
    uint64_t at = 0;
    size_t wrong = 0;
    for (size_t piece = 0; piece < sizes.size(); ++piece)
      for (uint64_t i = 0; i < sizes[piece]; ++i) wrong += back[at++] != byte_of(piece, i);
    EXPECT_EQ(wrong, 0u);
    const std::string other = (d / "never.bin").string();
    EXPECT_THROW(write_file_atomic_direct_filled(other, sizes,
                                                 [&](size_t piece, uint64_t, char* dst, size_t n) {
                                                   if (piece == 3) throw InputError("bad source");
                                                   std::fill(dst, dst + n, 'x');
                                                 }),
                 InputError);
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(d)) left.push_back(e.path().filename().string());
    EXPECT_EQ(left, std::vector<std::string>{"out.bin"});
    fs::remove_all(d);
  }
}

// A signal that ends the process while a file is being written removes the
// temporary first (an interrupted tokenize left hundreds of MB behind).
TEST(AtomicWrite, ASignalThatEndsTheProcessRemovesTheTemporary) {
  const fs::path dir = fs::path(testing::TempDir()) / "atomic_signal";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const int sig : {SIGINT, SIGTERM}) {
    EXPECT_EXIT(
        {
          std::signal(sig, SIG_DFL);
          AtomicFile f((dir / "out.bin").string());
          f.write(std::string(1 << 20, 'x'));
          std::raise(sig);
        },
        testing::KilledBySignal(sig), "");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 0) << sig;
  }
}

TEST(ReadFile, MissingFileIsAnInputErrorNamingIt) {
  try {
    read_file("/nonexistent/anvil/file");
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/anvil/file"), std::string::npos);
  }
}

}  // namespace
}  // namespace anvil
