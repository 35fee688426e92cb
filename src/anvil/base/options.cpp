#include "anvil/base/options.hpp"

#include <algorithm>

namespace anvil {

std::string OptionInfo::long_flag() const {
  std::string f = flag.empty() ? name : flag;
  std::replace(f.begin(), f.end(), '_', '-');
  return "--" + f;
}

Check<std::string> one_of(std::vector<std::string> choices) {
  return [choices = std::move(choices)](const std::string& v) -> std::string {
    if (std::find(choices.begin(), choices.end(), v) != choices.end()) return "";
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i)
      list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
    return "must be " + list;
  };
}

std::vector<std::string> unknown_option_keys(const nlohmann::json& in,
                                             const std::vector<std::string>& known) {
  std::vector<std::string> unknown;
  for (const auto& [section, values] : in.items()) {
    if (!values.is_object()) {
      unknown.push_back(section);
      continue;
    }
    for (const auto& [name, value] : values.items()) {
      const std::string key = section + "." + name;
      if (std::find(known.begin(), known.end(), key) == known.end()) unknown.push_back(key);
    }
  }
  return unknown;
}

}  // namespace anvil
