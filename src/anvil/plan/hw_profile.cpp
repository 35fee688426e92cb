#include "anvil/plan/hw_profile.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <set>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"

namespace anvil::plan {
namespace {

using json = nlohmann::json;

// Typed field access that names the file and the field on error.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw InputError(where_ + ": expected a JSON object");
  }

  const json& at(const std::string& key) const {
    if (!j_.contains(key)) throw InputError(where_ + "." + key + ": missing");
    return j_.at(key);
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  std::string path(const std::string& key) const { return where_ + "." + key; }

  std::string str(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) throw InputError(path(key) + ": expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  double num(const std::string& key, double min = 0) const {
    const json& v = at(key);
    if (!v.is_number() || v.get<double>() < min) {
      throw InputError(path(key) + ": expected a number >= " + std::to_string(min) + ", got " +
                       v.dump());
    }
    return v.get<double>();
  }
  int64_t integer(const std::string& key, int64_t min = 0) const {
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < min) {
      throw InputError(path(key) + ": expected an integer >= " + std::to_string(min) + ", got " +
                       v.dump());
    }
    return v.get<int64_t>();
  }
  bool boolean(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_boolean()) throw InputError(path(key) + ": expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  const json& array(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_array()) throw InputError(path(key) + ": expected an array");
    return v;
  }

 private:
  const json& j_;
  std::string where_;
};

std::string one_of(const Reader& r, const std::string& key, const std::set<std::string>& allowed) {
  const std::string v = r.str(key);
  if (allowed.count(v) == 0) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : " | ") + a;
    throw InputError(r.path(key) + ": expected " + list + ", got \"" + v + "\"");
  }
  return v;
}

const std::set<std::string> kDtypes = {"f64", "f32", "tf32", "bf16", "f16", "fp8", "int8"};

}  // namespace

double HwProfile::peak_gflops(const std::string& dtype) const {
  double best = 0;
  for (const auto& p : peak) {
    if (p.dtype == dtype) best = std::max(best, p.gflops);
  }
  return best;
}

json to_json(const HwProfile& p) {
  json j = {{"format", "anvil-hw-profile"},
            {"version", p.version},
            {"name", p.name},
            {"device", p.device},
            {"kind", p.kind},
            {"origin", p.origin},
            {"created", p.created},
            {"compute_units", p.compute_units},
            {"compute_unit_name", p.compute_unit_name},
            {"clock_ghz", p.clock_ghz},
            {"memory_bytes", p.memory_bytes},
            {"memory_bandwidth_gbs", p.memory_bandwidth_gbs},
            {"peak", json::array()},
            {"work_for_90pct_flops", p.work_for_90pct_flops},
            {"gemm_efficiency", json::object()},
            {"memory_levels", json::array()},
            {"attention", json::array()},
            {"gemm_shapes", json::array()},
            {"gemm_grid", json::array()},
            {"interconnect",
             {{"devices_per_node", p.interconnect.devices_per_node},
              {"intra_node_link", p.interconnect.intra_node_link},
              {"intra_node_gbs_per_direction", p.interconnect.intra_node_gbs},
              {"nics_per_node", p.interconnect.nics_per_node},
              {"nic_gbps", p.interconnect.nic_gbps},
              {"topology", p.interconnect.topology}}},
            {"comm", p.comm},
            {"sources", json::array()}};
  for (const auto& e : p.peak) {
    j["peak"].push_back({{"dtype", e.dtype}, {"threads", e.threads}, {"gflops", e.gflops}});
  }
  for (const auto& [dtype, curve] : p.gemm_efficiency) {
    json points = json::array();
    for (const auto& pt : curve)
      points.push_back({{"flops", pt.flops}, {"efficiency", pt.efficiency}});
    j["gemm_efficiency"][dtype] = points;
  }
  for (const auto& m : p.memory_levels) {
    j["memory_levels"].push_back({{"level", m.level},
                                  {"working_set_bytes", m.working_set_bytes},
                                  {"threads", m.threads},
                                  {"gbs", m.gbs}});
  }
  for (const auto& a : p.attention) {
    j["attention"].push_back(
        {{"dtype", a.dtype}, {"seq", a.seq}, {"head_dim", a.head_dim}, {"gflops", a.gflops}});
  }
  for (const auto* list : {&p.gemm_shapes, &p.gemm_grid}) {
    json& out = j[list == &p.gemm_shapes ? "gemm_shapes" : "gemm_grid"];
    for (const auto& g : *list) {
      out.push_back({{"dtype", g.dtype},
                     {"m", g.m},
                     {"n", g.n},
                     {"k", g.k},
                     {"trans_a", g.trans_a},
                     {"trans_b", g.trans_b},
                     {"threads", g.threads},
                     {"gflops", g.gflops}});
    }
  }
  j["achievable"] = {
      {"memory", p.achievable.memory}, {"gemm", p.achievable.gemm}, {"link", p.achievable.link}};
  for (const auto& s : p.sources) {
    j["sources"].push_back({{"field", s.field}, {"value", s.value}, {"source", s.source}});
  }
  return j;
}

HwProfile hw_profile_from_json(const json& j, const std::string& origin) {
  const Reader r(j, origin);
  if (r.str("format") != "anvil-hw-profile") {
    throw InputError(origin + ".format: expected \"anvil-hw-profile\"");
  }
  HwProfile p;
  p.version = static_cast<int>(r.integer("version", 1));
  if (p.version != 1) {
    throw InputError(origin + ".version: expected 1, got " + std::to_string(p.version));
  }
  p.name = r.str("name");
  p.device = r.str("device");
  p.kind = one_of(r, "kind", {"cpu", "gpu"});
  p.origin = one_of(r, "origin", {"measured", "published"});
  p.created = r.str("created");
  p.compute_units = r.integer("compute_units", 1);
  p.compute_unit_name = r.str("compute_unit_name");
  p.clock_ghz = r.num("clock_ghz");
  p.memory_bytes = r.integer("memory_bytes", 1);
  p.memory_bandwidth_gbs = r.num("memory_bandwidth_gbs");
  const json& peaks = r.array("peak");
  for (size_t i = 0; i < peaks.size(); ++i) {
    const Reader e(peaks[i], r.path("peak") + "[" + std::to_string(i) + "]");
    p.peak.push_back(
        {one_of(e, "dtype", kDtypes), static_cast<int>(e.integer("threads")), e.num("gflops")});
  }
  if (p.peak.empty()) throw InputError(r.path("peak") + ": expected at least one entry");
  const Reader work(r.at("work_for_90pct_flops"), r.path("work_for_90pct_flops"));
  for (const auto& [dtype, v] : r.at("work_for_90pct_flops").items()) {
    if (kDtypes.count(dtype) == 0) throw InputError(work.path(dtype) + ": unknown dtype");
    p.work_for_90pct_flops[dtype] = work.num(dtype);
  }
  const Reader eff(r.at("gemm_efficiency"), r.path("gemm_efficiency"));
  for (const auto& [dtype, curve] : r.at("gemm_efficiency").items()) {
    if (kDtypes.count(dtype) == 0) throw InputError(eff.path(dtype) + ": unknown dtype");
    const json& points = eff.array(dtype);
    for (size_t i = 0; i < points.size(); ++i) {
      const Reader pt(points[i], eff.path(dtype) + "[" + std::to_string(i) + "]");
      p.gemm_efficiency[dtype].push_back({pt.num("flops"), pt.num("efficiency")});
    }
  }
  const json& levels = r.array("memory_levels");
  for (size_t i = 0; i < levels.size(); ++i) {
    const Reader m(levels[i], r.path("memory_levels") + "[" + std::to_string(i) + "]");
    p.memory_levels.push_back({one_of(m, "level", {"L1", "L2", "L3", "DRAM", "HBM"}),
                               m.integer("working_set_bytes"),
                               static_cast<int>(m.integer("threads")), m.num("gbs")});
  }
  if (r.has("attention")) {
    const json& att = r.array("attention");
    for (size_t i = 0; i < att.size(); ++i) {
      const Reader a(att[i], r.path("attention") + "[" + std::to_string(i) + "]");
      p.attention.push_back({one_of(a, "dtype", kDtypes), a.integer("seq", 1),
                             a.integer("head_dim", 1), a.num("gflops")});
    }
  }
  for (const char* key : {"gemm_shapes", "gemm_grid"}) {
    if (!r.has(key)) continue;
    auto& list = std::string(key) == "gemm_shapes" ? p.gemm_shapes : p.gemm_grid;
    const json& shapes = r.array(key);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Reader g(shapes[i], r.path(key) + "[" + std::to_string(i) + "]");
      list.push_back({one_of(g, "dtype", kDtypes), g.integer("m", 1), g.integer("n", 1),
                      g.integer("k", 1), g.boolean("trans_a"), g.boolean("trans_b"),
                      static_cast<int>(g.integer("threads")), g.num("gflops")});
    }
  }
  if (r.has("achievable")) {
    const Reader a(r.at("achievable"), r.path("achievable"));
    auto fraction = [&](const Reader& rd, const std::string& k) {
      const double v = rd.num(k);
      if (v < 0 || v > 1)
        throw InputError(rd.path(k) + ": expected a fraction in [0, 1], got " + std::to_string(v));
      return v;
    };
    if (a.has("memory")) p.achievable.memory = fraction(a, "memory");
    if (a.has("link")) p.achievable.link = fraction(a, "link");
    if (a.has("gemm")) {
      const Reader g(a.at("gemm"), a.path("gemm"));
      if (!a.at("gemm").is_object()) throw InputError(a.path("gemm") + ": expected an object");
      for (const auto& [dtype, v] : a.at("gemm").items()) {
        (void)v;
        p.achievable.gemm[dtype] = fraction(g, dtype);
      }
    }
  }
  const Reader ic(r.at("interconnect"), r.path("interconnect"));
  p.interconnect.devices_per_node = static_cast<int>(ic.integer("devices_per_node", 1));
  p.interconnect.intra_node_link = ic.str("intra_node_link");
  // Per direction; an older profile's intra_node_gbs counted both directions.
  p.interconnect.intra_node_gbs = ic.has("intra_node_gbs_per_direction")
                                      ? ic.num("intra_node_gbs_per_direction")
                                      : ic.num("intra_node_gbs") / 2;
  p.interconnect.nics_per_node = static_cast<int>(ic.integer("nics_per_node"));
  p.interconnect.nic_gbps = ic.num("nic_gbps");
  p.interconnect.topology = ic.str("topology");
  if (r.has("comm")) {
    if (!r.at("comm").is_object()) throw InputError(r.path("comm") + ": expected an object");
    p.comm = r.at("comm");
  }
  const json& sources = r.array("sources");
  for (size_t i = 0; i < sources.size(); ++i) {
    const Reader s(sources[i], r.path("sources") + "[" + std::to_string(i) + "]");
    p.sources.push_back({s.str("field"), s.str("value"), s.str("source")});
  }
  if (p.origin == "published" && p.sources.empty()) {
    throw InputError(r.path("sources") + ": a published profile must cite its sources");
  }
  return p;
}

HwProfile load_hw_profile(const std::string& path) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
  return hw_profile_from_json(j, path);
}

void save_hw_profile(const HwProfile& profile, const std::string& path) {
  write_file_atomic(path, to_json(profile).dump(2) + "\n");
}

namespace {

std::vector<std::filesystem::path> profile_dirs() {
  std::vector<std::filesystem::path> dirs;
  if (const char* env = std::getenv("ANVIL_PROFILES"); env && *env) dirs.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "profiles");
  dirs.emplace_back("profiles");
  return dirs;
}

}  // namespace

std::vector<std::string> shipped_profile_names() {
  std::vector<std::string> names;
  for (const auto& dir : profile_dirs()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".json") continue;
      const std::string n = e.path().stem().string();
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

HwProfile find_hw_profile(const std::string& name_or_path, const std::string& flag) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return load_hw_profile(name_or_path);
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               name_or_path.find(".json") != std::string::npos;
  if (!looks_like_path) {
    for (const auto& dir : profile_dirs()) {
      const auto file = dir / (name_or_path + ".json");
      if (std::filesystem::is_regular_file(file, ec)) return load_hw_profile(file.string());
    }
  }
  std::string known;
  for (const auto& n : shipped_profile_names()) known += (known.empty() ? "" : ", ") + n;
  throw InputError(flag + ": unknown hardware '" + name_or_path + "'; expected one of " +
                   (known.empty() ? std::string("(no profiles/ found)") : known) +
                   " or a profile file from anvil hw --profile FILE");
}

}  // namespace anvil::plan
