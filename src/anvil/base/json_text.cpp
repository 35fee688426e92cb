#include "anvil/base/json_text.hpp"

#include <set>
#include <vector>

#include "anvil/base/error.hpp"

namespace anvil {

nlohmann::json parse_json_unique(std::string_view text, const std::string& what) {
  using Event = nlohmann::json::parse_event_t;
  struct Open {
    std::set<std::string> keys;
    std::string name;  // the key this object is the value of
  };
  std::vector<Open> open;
  std::string last_key, repeated;
  const nlohmann::json::parser_callback_t on_event = [&](int, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) {
      open.push_back({{}, last_key});
      last_key.clear();
    } else if (event == Event::object_end) {
      if (!open.empty()) open.pop_back();
      last_key.clear();
    } else if (event == Event::key) {
      last_key = parsed.get<std::string>();
      if (repeated.empty() && !open.empty() && !open.back().keys.insert(last_key).second) {
        for (const auto& o : open)
          if (!o.name.empty()) repeated += o.name + ".";
        repeated += last_key;
      }
    } else if (event == Event::array_start || event == Event::array_end) {
      last_key.clear();
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(what + ": not valid JSON (" + e.what() + ")");
  }
  if (!repeated.empty())
    throw InputError(what + ": key " + repeated +
                     " appears twice in one object (expected unique keys)");
  return j;
}

int64_t json_integer(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi) {
  const bool fits = v.is_number_unsigned()
                        ? hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                        : v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!fits)
    throw InputError(what + ": expected an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], got " + v.dump());
  return v.get<int64_t>();
}

}  // namespace anvil
