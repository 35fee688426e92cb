#include <gtest/gtest.h>

#include <filesystem>

#include "anvil/base/error.hpp"
#include "anvil/plan/hw_profile.hpp"

namespace anvil::plan {
namespace {

const std::string kProfiles = std::string(ANVIL_SOURCE_DIR) + "/profiles/";

HwProfile sample() {
  HwProfile p;
  p.name = "local";
  p.device = "Test CPU";
  p.kind = "cpu";
  p.origin = "measured";
  p.created = "2026-11-29";
  p.compute_units = 2;
  p.compute_unit_name = "core";
  p.clock_ghz = 0.1 + 0.2;  // not exactly representable: must survive the trip
  p.memory_bytes = int64_t{24} << 30;
  p.memory_bandwidth_gbs = 21.734;
  p.peak = {{"f32", 1, 171.25}, {"f32", 2, 333.3}, {"bf16", 2, 640.1}};
  p.work_for_90pct_flops = {{"f32", 2.147483648e9}};
  p.gemm_efficiency = {{"f32", {{1e6, 0.25}, {1e9, 0.97}}}};
  p.memory_levels = {{"L1", 16384, 1, 150.5}, {"DRAM", int64_t{1} << 30, 2, 21.7}};
  p.attention = {{"f32", 256, 64, 29.97}};
  p.gemm_shapes = {{"bf16", 1024, 768, 768, false, true, 2, 151.25}};
  p.gemm_grid = {{"f32", 64, 4096, 256, true, false, 2, 88.5}};
  p.achievable = {0.81, {{"bf16", 0.47}}, 0.82};
  p.interconnect = {1, "shared memory", 12.5, 0, 0, "single node"};
  p.comm = {{"allreduce", {{"alpha_us", 3.5}}}};
  p.sources = {{"*", "measured", "anvil hw --profile"}};
  return p;
}

std::string error_of(const nlohmann::json& j) {
  try {
    hw_profile_from_json(j, "p.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HwProfile, JsonRoundTripIsExact) {
  const HwProfile p = sample();
  EXPECT_EQ(hw_profile_from_json(to_json(p), "x"), p);
}

TEST(HwProfile, FileRoundTripIsExact) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("anvil-profile-" + std::to_string(::getpid()) + ".json");
  save_hw_profile(sample(), path.string());
  EXPECT_EQ(load_hw_profile(path.string()), sample());
  std::filesystem::remove(path);
}

TEST(HwProfile, PeakForADtypeIsTheBestThreadCount) {
  EXPECT_EQ(sample().peak_gflops("f32"), 333.3);
  EXPECT_EQ(sample().peak_gflops("fp8"), 0);
}

TEST(HwProfile, ErrorsNameTheField) {
  auto j = to_json(sample());
  j.erase("memory_bytes");
  EXPECT_NE(error_of(j).find("p.json.memory_bytes: missing"), std::string::npos);
  j = to_json(sample());
  j["peak"][1]["dtype"] = "f17";
  EXPECT_NE(error_of(j).find("p.json.peak[1].dtype: expected"), std::string::npos) << error_of(j);
  j = to_json(sample());
  j["kind"] = "tpu";
  EXPECT_NE(error_of(j).find("p.json.kind"), std::string::npos);
  j = to_json(sample());
  j["version"] = 2;
  EXPECT_NE(error_of(j).find("p.json.version: expected 1"), std::string::npos);
  j = to_json(sample());
  j["achievable"]["memory"] = 1.2;
  EXPECT_NE(error_of(j).find("p.json.achievable.memory: expected a fraction"), std::string::npos)
      << error_of(j);
  // An older profile's intra_node_gbs counted both directions.
  j = to_json(sample());
  j["interconnect"].erase("intra_node_gbs_per_direction");
  j["interconnect"]["intra_node_gbs"] = 900;
  EXPECT_EQ(hw_profile_from_json(j, "p.json").interconnect.intra_node_gbs, 450);
  j = to_json(sample());
  j["origin"] = "published";
  j["sources"] = nlohmann::json::array();
  EXPECT_NE(error_of(j).find("must cite its sources"), std::string::npos);
}

TEST(HwProfile, ShippedProfilesLoadAndCiteEveryFigure) {
  for (const std::string name : {"mi300x", "h100-sxm", "h200-sxm"}) {
    const HwProfile p = load_hw_profile(kProfiles + name + ".json");
    EXPECT_EQ(p.name, name);
    EXPECT_EQ(p.origin, "published");
    EXPECT_GT(p.peak_gflops("bf16"), 0) << name;
    EXPECT_GT(p.memory_bandwidth_gbs, 0) << name;
    // Every peak figure and the memory figures have a source.
    for (const auto& pk : p.peak) {
      bool cited = false;
      for (const auto& s : p.sources) cited = cited || s.field == "peak[" + pk.dtype + "]";
      EXPECT_TRUE(cited) << name << " peak[" << pk.dtype << "] has no source";
    }
    for (const std::string field :
         {"compute_units", "memory_bytes", "memory_bandwidth_gbs", "interconnect.intra_node_gbs_per_direction", "achievable.memory", "achievable.gemm[bf16]", "achievable.link"}) {
      bool cited = false;
      for (const auto& s : p.sources) cited = cited || s.field == field;
      EXPECT_TRUE(cited) << name << " " << field << " has no source";
    }
  }
}

TEST(HwProfile, PublishedFiguresMatchTheDatasheets) {
  const HwProfile mi = load_hw_profile(kProfiles + "mi300x.json");
  EXPECT_EQ(mi.compute_units, 304);
  EXPECT_DOUBLE_EQ(mi.peak_gflops("bf16"), 1307400);
  EXPECT_DOUBLE_EQ(mi.memory_bandwidth_gbs, 5300);
  const HwProfile h100 = load_hw_profile(kProfiles + "h100-sxm.json");
  EXPECT_EQ(h100.compute_units, 132);
  const HwProfile h200 = load_hw_profile(kProfiles + "h200-sxm.json");
  EXPECT_DOUBLE_EQ(h200.memory_bandwidth_gbs, 4800);
  EXPECT_EQ(h200.peak_gflops("bf16"), h100.peak_gflops("bf16"));
}

}  // namespace
}  // namespace anvil::plan
