#include <gtest/gtest.h>

#include "anvil/base/table.hpp"

namespace anvil {
namespace {

TEST(Table, AlignsNumbersRightAndWordsLeft) {
  Table t({"name", "value"});
  t.add_row({"a", "1.5"});
  t.add_row({"longer", "10.25"});
  EXPECT_EQ(t.to_text(),
            "name    value\n"
            "-------------\n"
            "a         1.5\n"
            "longer  10.25\n");
}

TEST(Table, CsvQuotesCommasAndQuotes) {
  Table t({"a", "b"});
  t.add_row({"x,y", "say \"hi\""});
  EXPECT_EQ(t.to_csv(), "a,b\n\"x,y\",\"say \"\"hi\"\"\"\n");
}

TEST(Table, RejectsRowsOfTheWrongWidth) {
  Table t({"a", "b"});
  EXPECT_THROW(t.add_row({"only one"}), std::logic_error);
}

TEST(Format, FixedDigitsAndDashForNan) {
  EXPECT_EQ(fmt(3.14159, 2), "3.14");
  EXPECT_EQ(fmt(std::nan(""), 2), "-");
}

TEST(Format, HumanBytes) {
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(16384), "16 KiB");
  EXPECT_EQ(human_bytes(1.5 * 1048576), "1.5 MiB");
  EXPECT_EQ(human_bytes(1073741824.0), "1 GiB");
}

}  // namespace
}  // namespace anvil
