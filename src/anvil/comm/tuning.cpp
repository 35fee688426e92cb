#include "anvil/comm/tuning.hpp"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/files.hpp"

namespace anvil::comm {

Algo TuningTable::pick(Op op, int ranks, size_t bytes, bool single_node) const {
  for (const auto& r : rows) {
    if (r.op == op && r.ranks == ranks && static_cast<int64_t>(bytes) <= r.max_bytes) {
      const bool needs_one_node = r.algo == Algo::shm;
      if (!needs_one_node || single_node) return r.algo;
    }
  }
  const Algo preferred = single_node ? Algo::shm : Algo::hier;
  return implements(op, preferred) ? preferred : Algo::mpi;
}

TuningTable TuningTable::load(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not a tuning table (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", "") != "anvil-comm-tuning" || !j.contains("rows") ||
      !j["rows"].is_array()) {
    throw InputError(path + ": expected {\"format\": \"anvil-comm-tuning\", \"rows\": [...]}");
  }
  TuningTable t;
  for (size_t i = 0; i < j["rows"].size(); ++i) {
    const auto& r = j["rows"][i];
    const std::string where = path + ": rows[" + std::to_string(i) + "]";
    try {
      const Algo a = parse_algo(r.at("algo").get<std::string>(), where + ".algo");
      if (a == Algo::automatic) throw InputError(where + ".algo: auto cannot choose itself");
      t.rows.push_back({parse_op(r.at("op").get<std::string>(), where + ".op"),
                        static_cast<int>(json_integer(r.at("ranks"), where + ".ranks", 1, 1 << 20)),
                        json_integer(r.at("max_bytes"), where + ".max_bytes", 0, INT64_MAX), a});
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": expected op, ranks, max_bytes, algo (" + e.what() + ")");
    }
  }
  std::stable_sort(t.rows.begin(), t.rows.end(), [](const TuningRow& a, const TuningRow& b) {
    return a.max_bytes < b.max_bytes;
  });
  return t;
}

void TuningTable::save(const std::string& path) const {
  nlohmann::json j = {
      {"format", "anvil-comm-tuning"}, {"version", 1}, {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    j["rows"].push_back({{"op", to_string(r.op)},
                         {"ranks", r.ranks},
                         {"max_bytes", r.max_bytes},
                         {"algo", to_string(r.algo)}});
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace anvil::comm
