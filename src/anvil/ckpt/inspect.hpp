// Looking into checkpoints without training: verifying every checkpoint of
// a run, and comparing two checkpoints tensor by tensor (any layouts), with
// missing optimizer state told apart from different values.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/base/table.hpp"
#include "anvil/ckpt/sharded.hpp"

namespace anvil::ckpt {

// `path`: a checkpoint or a run directory (each of its checkpoints).
std::vector<VerifyReport> verify_path(const std::string& path);
Table verify_table(const std::vector<VerifyReport>& reports);
nlohmann::json verify_json(const std::vector<VerifyReport>& reports);

struct DiffReport {
  std::string a, b;       // the checkpoints compared
  int64_t compared = 0;   // tensors in both, of the same shape
  int64_t identical = 0;  // of those, the same bytes
  struct Different {
    std::string name;
    double max_abs = 0;
  };
  std::vector<Different> different;         // the same name, other values
  std::vector<std::string> only_a, only_b;  // names found on one side only (or another shape)
  int64_t optimizer_only_a = 0, optimizer_only_b = 0;  // optimizer state on one side only
  // True when every tensor in both has the same bytes and no weights are
  // missing on either side (optimizer state present on one side only, as
  // in a run against its Hugging Face round trip, is said, not counted).
  bool same() const { return different.empty() && only_a.empty() && only_b.empty(); }
  std::string text() const;
  // Every differing tensor with its largest difference, the one-sided
  // names, the counts and "same" (anvil ckpt diff --json).
  nlohmann::json to_json() const;
};
DiffReport diff_checkpoints(const std::string& a, const std::string& b);

}  // namespace anvil::ckpt
