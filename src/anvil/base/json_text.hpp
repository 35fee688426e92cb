// JSON read from files someone else wrote (checkpoints, configs): nlohmann
// keeps the last of two equal keys in an object without a word, so a file
// naming a field twice would be read as whichever came last. These parsers
// see every key and refuse the repeat instead.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace anvil {

// Parses `text`; throws InputError "<what>: not valid JSON (...)" on a
// syntax error and "<what>: key K appears twice in one object (expected
// unique keys)" on a repeated key, K given with its enclosing keys
// (tensors.w.shards).
nlohmann::json parse_json_unique(std::string_view text, const std::string& what);

}  // namespace anvil
