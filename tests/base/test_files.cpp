#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
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
