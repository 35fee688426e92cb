#include "anvil/base/table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "anvil/base/error.hpp"

namespace anvil {

Table::Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != columns_.size()) {
    throw std::logic_error("Table::add_row: " + std::to_string(cells.size()) + " cells for " +
                           std::to_string(columns_.size()) + " columns");
  }
  rows_.push_back(std::move(cells));
}

namespace {

bool numeric_cell(const std::string& s) {
  if (s == "-") return true;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end && *end == '\0';
}

}  // namespace

std::string Table::to_text() const {
  std::vector<size_t> width(columns_.size());
  std::vector<bool> right(columns_.size(), true);  // numbers right, words left
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].size();
    for (const auto& row : rows_) {
      width[c] = std::max(width[c], row[c].size());
      if (!numeric_cell(row[c])) right[c] = false;
    }
  }
  std::ostringstream out;
  auto emit = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) out << "  ";
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (right[c]) {
        out << pad << cells[c];
      } else {
        out << cells[c] << (c + 1 < cells.size() ? pad : "");
      }
    }
    out << '\n';
  };
  emit(columns_);
  size_t total = 0;
  for (size_t w : width) total += w;
  out << std::string(total + 2 * (width.empty() ? 0 : width.size() - 1), '-') << '\n';
  for (const auto& row : rows_) emit(row);
  return out.str();
}

std::string Table::to_csv() const {
  std::ostringstream out;
  auto cell = [&](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) {
      out << s;
      return;
    }
    out << '"';
    for (char ch : s) out << (ch == '"' ? "\"\"" : std::string(1, ch));
    out << '"';
  };
  auto emit = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) out << ',';
      cell(cells[c]);
    }
    out << '\n';
  };
  emit(columns_);
  for (const auto& row : rows_) emit(row);
  return out.str();
}

std::string fmt(double value, int digits) {
  if (std::isnan(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string significant(double value, int digits) {
  if (std::isnan(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, value);
  return buf;
}

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  if (bytes == std::floor(bytes)) {
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  }
  return buf;
}

}  // namespace anvil
