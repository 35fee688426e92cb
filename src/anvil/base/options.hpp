// Options declared once. A component's options struct holds its fields with
// their defaults and lists each one in `describe(v)`: its name, help text and
// check on one line. That one list serves the command line (apps/ registers a
// flag per option), run files (JSON, read and written here), the record a run
// leaves in its directory, and the checks, whose errors name the option by
// its key ("train.batch: must be >= 1, got 0"); only the command line speaks
// of --flags.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "anvil/base/error.hpp"

namespace anvil {

// One option of a section. Its key is "section.name"; its command-line flag
// is --NAME with '_' as '-' unless `flag` says otherwise.
struct OptionInfo {
  std::string name;
  std::string help;
  std::string flag = "";                  // long flag without dashes ("" : from name)
  std::vector<std::string> aliases = {};  // more flags, with their dashes ("-B", "--precision")
  bool cli = true;                        // false: set by run files and recipes only
  std::string section = "";               // filled in by the section walk
  std::string key() const { return section.empty() ? name : section + "." + name; }
  std::string long_flag() const;
};

// A check returns "" when the value is acceptable, else what it must be
// ("must be >= 1"); the caller adds the key and the value.
template <class T>
using Check = std::function<std::string(const T&)>;

template <class T>
std::string option_text(const T& value) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, bool>) {
    s << (value ? "true" : "false");
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    for (size_t i = 0; i < value.size(); ++i) s << (i ? "," : "") << value[i];
  } else {
    s << value;
  }
  return s.str();
}

template <class T>
Check<T> at_least(T lo) {
  return [lo](const T& v) {
    if constexpr (std::is_floating_point_v<T>) {  // inf is >= anything, and no setting
      if (!std::isfinite(v)) return "must be a finite number >= " + option_text(lo);
    }
    return v >= lo ? std::string() : "must be >= " + option_text(lo);
  };
}
template <class T>
Check<T> in_range(T lo, T hi) {
  return [lo, hi](const T& v) {
    return v >= lo && v <= hi ? ""
                              : "must be in [" + option_text(lo) + ", " + option_text(hi) + "]";
  };
}
Check<std::string> one_of(std::vector<std::string> choices);
// Outputs (base/files.hpp's output_path_problem): a directory to create or
// write in, a file to write.
Check<std::string> output_dir_check();
Check<std::string> output_file_check();

// What `describe(v)` calls: v({.name = ..., .help = ...}, field, check),
// the check optional. It hands each option, in `section`, to `visit(info,
// field, check)` (a generic callable: field is T&, check a Check<T>).
template <class Visit>
struct SectionWalk {
  std::string section;
  Visit& visit;
  template <class T>
  void operator()(OptionInfo info, T& field, std::type_identity_t<Check<T>> check = {}) {
    info.section = section;
    visit(static_cast<const OptionInfo&>(info), field, check);
  }
};

// Walks the options of `options` (a struct with `describe(v)`) under `section`.
template <class Options, class Visit>
void walk_section(Options& options, const std::string& section, Visit&& visit) {
  SectionWalk<std::remove_reference_t<Visit>> walk{section, visit};
  options.describe(walk);
}

// The visitors every options struct supports: the checks, JSON out, JSON in.
template <class T>
void check_option(const OptionInfo& info, const T& value, const Check<T>& check) {
  if (!check) return;
  const std::string why = check(value);
  if (!why.empty()) throw InputError(info.key() + ": " + why + ", got " + option_text(value));
}

template <class T>
void option_to_json(const OptionInfo& info, const T& value, nlohmann::json& out) {
  out[info.section][info.name] = value;
}

// Sets `value` from `in[section][name]` when present; a value of the wrong
// type is an InputError naming `origin` and the key.
template <class T>
void option_from_json(const OptionInfo& info, T& value, const nlohmann::json& in,
                      const std::string& origin) {
  const auto s = in.find(info.section);
  if (s == in.end()) return;
  const auto v = s->find(info.name);
  if (v == s->end()) return;
  const auto wrong = [&] {
    return InputError(origin + ": " + info.key() + ": expected a value like " +
                      nlohmann::json(value).dump() + ", got " + v->dump());
  };
  // nlohmann converts any number to any arithmetic type with a plain cast,
  // which is undefined for a float out of an integer's range (1e33 into a
  // uint64_t): an integer option takes only an integer in its type's range.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!v->is_number_integer()) throw wrong();
    if (v->is_number_unsigned()) {
      const auto u = v->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) throw wrong();
    } else {
      const auto i = v->get<std::int64_t>();
      if (i < 0 ? (std::is_unsigned_v<T> ||
                   i < static_cast<std::int64_t>(std::numeric_limits<T>::min()))
                : static_cast<std::uint64_t>(i) >
                      static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
        throw wrong();
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v->is_number()) throw wrong();
  }
  try {
    value = v->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw wrong();
  }
}

// The keys of `in` ("section.name") that no option of `known` has.
std::vector<std::string> unknown_option_keys(const nlohmann::json& in,
                                             const std::vector<std::string>& known);

}  // namespace anvil
