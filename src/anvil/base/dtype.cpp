#include "anvil/base/dtype.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "anvil/base/error.hpp"

namespace anvil {
namespace {

struct Names {
  Dtype dtype;
  const char* name;
  std::vector<const char*> aliases;
};

const std::array<Names, 8>& table() {
  static const std::array<Names, 8> t = {{
      {Dtype::fp32, "fp32", {"f32", "float32", "float"}},
      {Dtype::bf16, "bf16", {"bfloat16"}},
      {Dtype::fp8, "fp8", {"f8", "float8", "e4m3"}},
      {Dtype::fp64, "fp64", {"f64", "float64", "double"}},
      {Dtype::int32, "int32", {"i32"}},
      {Dtype::int64, "int64", {"i64"}},
      {Dtype::fp16, "fp16", {"f16", "float16", "half"}},
      {Dtype::tf32, "tf32", {"tensorfloat32"}},
  }};
  return t;
}

bool allowed_in(Dtype d, std::initializer_list<Dtype> allowed) {
  return allowed.size() == 0 || std::find(allowed.begin(), allowed.end(), d) != allowed.end();
}

}  // namespace

size_t dtype_bytes(Dtype t) {
  switch (t) {
    case Dtype::fp8:
      return 1;
    case Dtype::bf16:
    case Dtype::fp16:
      return 2;
    case Dtype::fp32:
    case Dtype::tf32:
    case Dtype::int32:
      return 4;
    case Dtype::fp64:
    case Dtype::int64:
      return 8;
  }
  return 4;
}

std::string to_string(Dtype dtype) {
  for (const auto& n : table())
    if (n.dtype == dtype) return n.name;
  return "?";
}

Dtype parse_dtype(const std::string& text, const std::string& key,
                  std::initializer_list<Dtype> allowed) {
  for (const auto& n : table()) {
    bool match = text == n.name;
    for (const char* a : n.aliases) match = match || text == a;
    if (match && allowed_in(n.dtype, allowed)) return n.dtype;
  }
  std::string names;
  for (const auto& n : table())
    if (allowed_in(n.dtype, allowed)) names += (names.empty() ? "" : ", ") + std::string(n.name);
  throw InputError(key + ": expected one of " + names + ", got '" + text + "'");
}

std::string dtype_names(std::initializer_list<Dtype> allowed) {
  std::string out;
  for (const auto& n : table()) {
    if (!allowed_in(n.dtype, allowed)) continue;
    out += (out.empty() ? "" : ", ") + std::string(n.name);
    std::string aliases;
    for (const char* a : n.aliases) aliases += (aliases.empty() ? "" : ", ") + std::string(a);
    if (!aliases.empty()) out += " (" + aliases + ")";
  }
  return out;
}

}  // namespace anvil
