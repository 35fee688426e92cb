// One result table, three renderings: aligned text for people, CSV and JSON
// for machines. Benchmarks fill a Table and never format by hand.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil {

class Table {
 public:
  explicit Table(std::vector<std::string> columns);

  // A row is one string per column; use fmt() for numbers.
  void add_row(std::vector<std::string> cells);

  const std::vector<std::string>& columns() const { return columns_; }
  const std::vector<std::vector<std::string>>& rows() const { return rows_; }

  std::string to_text() const;  // right-aligned columns, header, rule
  std::string to_csv() const;   // RFC 4180 quoting

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Fixed-point formatting with `digits` decimals; "-" for NaN.
std::string fmt(double value, int digits = 1);

// `digits` significant digits (%g: 0.00419, 17.2, 1.2e+04); "-" for NaN.
std::string significant(double value, int digits = 3);

// "16 KiB", "1.5 MiB", ...
std::string human_bytes(double bytes);

}  // namespace anvil
