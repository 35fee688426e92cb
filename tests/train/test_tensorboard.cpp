// TensorBoard event files: whole TFRecord records, also when a write fails
// part-way (a full disk): the record is cut back off and the next one fits.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/train/tensorboard.hpp"

namespace anvil::train {
namespace {

namespace fs = std::filesystem;

// The records' lengths when `bytes` is whole TFRecord records, else {}.
std::vector<uint64_t> record_lengths(const std::string& bytes) {
  std::vector<uint64_t> out;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) return {};
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[at + i]);
    if (bytes.size() - at < 12 + n + 4) return {};
    out.push_back(n);
    at += 12 + n + 4;
  }
  return out;
}

TEST(TensorBoard, AFailedWriteLeavesWholeRecordsAndTheNextOneFits) {
  const std::string dir = testing::TempDir() + "/tensorboard_full";
  fs::remove_all(dir);
  EventWriter w(dir);
  w.scalars(1, {{"train/loss", 5.5}});
  const std::string before = read_file(w.path());
  ASSERT_EQ(record_lengths(before).size(), 2u);  // file_version, step 1
  // A file-size limit a few bytes past the end: the next record cannot fit
  // (EFBIG, as ENOSPC on a full disk) and is written only in part.
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = before.size() + 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tight), 0);
  bool threw = false;
  try {
    w.scalars(2, {{"train/loss", 5.25}, {"train/lr", 1e-3}});
  } catch (const SystemError& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(w.path()), std::string::npos) << e.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_file(w.path()), before);  // the part written is cut back off
  w.scalars(3, {{"train/loss", 5.0}});
  EXPECT_EQ(record_lengths(read_file(w.path())).size(), 3u);
}

}  // namespace
}  // namespace anvil::train
