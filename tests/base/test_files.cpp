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
