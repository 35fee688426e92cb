#include "anvil/base/options.hpp"

#include <algorithm>

#include "anvil/base/files.hpp"

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

Check<std::string> output_dir_check() {
  return [](const std::string& v) { return output_path_problem(v, /*dir=*/true); };
}

Check<std::string> output_file_check() {
  return [](const std::string& v) { return output_path_problem(v, /*dir=*/false); };
}

std::vector<std::string> unknown_option_keys(const nlohmann::json& in,
                                             const std::vector<std::string>& known) {
  std::vector<std::string> unknown;
  for (const auto& [section, values] : in.items()) {
    const std::string prefix = section + ".";  // (clang captures no structured binding)
    const bool known_section = std::any_of(known.begin(), known.end(), [&](const std::string& k) {
      return k.rfind(prefix, 0) == 0;
    });
    if (!values.is_object() || (!known_section && values.empty())) {  // an empty unknown one too
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
