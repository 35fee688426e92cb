// JSON read from files someone else wrote (checkpoints, configs): nlohmann
// keeps the last of two equal keys in an object without a word, so a file
// naming a field twice would be read as whichever came last. These parsers
// see every key and refuse the repeat instead.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace anvil {

// Parses `text`; throws InputError "<what>: not valid JSON (...)" on a
// syntax error and "<what>: key K appears twice in one object (expected
// unique keys)" on a repeated key, K given with its enclosing keys
// (tensors.w.shards).
nlohmann::json parse_json_unique(std::string_view text, const std::string& what);

// `v` as an integer in [lo, hi]; anything else (a float, a string, a number
// out of range) throws InputError "<what>: expected an integer in [lo, hi],
// got V". nlohmann's get<int>() would cast a float or a wide integer
// instead, which is undefined for 1e33.
int64_t json_integer(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi);

}  // namespace anvil
