#include "anvil/ft/faults.hpp"

#include <charconv>

#include "anvil/base/error.hpp"

namespace anvil::ft {

std::string fault_kinds() {
  return "kill, term, hang, nan, spike, slow, slow-rank, corrupt-ckpt, kill-in-save, "
         "disk-full, flip-param";
}

Fault parse_fault(const std::string& text, const std::string& key) {
  const auto bad = [&] {
    return InputError(key + ": expected KIND@STEP[:RANK][=ARG] with KIND one of " +
                      fault_kinds() + ", e.g. kill@30:1 or slow@5=200, got '" + text + "'");
  };
  Fault f;
  const auto at = text.find('@');
  if (at == std::string::npos || at == 0) throw bad();
  f.kind = text.substr(0, at);
  const std::string kinds = ", " + fault_kinds() + ",";
  if (kinds.find(", " + f.kind + ",") == std::string::npos) throw bad();  // a whole kind
  const char* p = text.data() + at + 1;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(p, end, f.step);
  if (r.ec != std::errc() || f.step < 1) throw bad();
  p = r.ptr;
  if (p < end && *p == ':') {
    r = std::from_chars(p + 1, end, f.rank);
    if (r.ec != std::errc() || f.rank < 0) throw bad();
    p = r.ptr;
  }
  if (p < end && *p == '=') {
    const std::string arg(p + 1, end);
    size_t used = 0;
    try {
      f.arg = std::stod(arg, &used);
    } catch (const std::exception&) {
      throw bad();
    }
    if (used != arg.size() || !(f.arg >= 0)) throw bad();
    p = end;
  }
  if (p != end) throw bad();
  if (f.kind == "slow" && !(f.arg > 0)) throw bad();
  if (f.kind == "slow-rank" && !(f.arg > 1)) throw bad();  // a factor above 1
  if (f.kind == "spike" && f.arg != 0 && !(f.arg > 1)) throw bad();  // ditto, 0: 10
  return f;
}

}  // namespace anvil::ft
