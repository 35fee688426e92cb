// The sharded checkpoint format: pieces written by several "ranks" come
// back whole or cut any other way; damage (a flipped byte, a short file, a
// hole in the tiling) is named; version-1 checkpoints still load; the
// newest intact checkpoint is found past damaged ones. And the faults
// anvil train --inject understands.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/model_tensors.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"
#include "support/input_error.hpp"

namespace anvil::ckpt {
namespace {
namespace fs = std::filesystem;

const std::string kState =
    R"({"format": "anvil-train-state", "step": 5, "config": {}, "seed": 1, "batch": 2, "seq": 8,
        "accum": 1})";

struct Fixture {
  std::vector<float> a, b, m;  // a [6, 5], b [7], optimizer state m of a
  Fixture() : a(30), b(7), m(30) {
    std::iota(a.begin(), a.end(), 1.0f);
    std::iota(b.begin(), b.end(), -3.5f);
    for (size_t i = 0; i < m.size(); ++i) m[i] = 0.25f * static_cast<float>(i * i);
  }
};

// Writes step 5 of `run` as `world` ranks, each a contiguous 1/world of
// every tensor; rank 0 last (it commits once every part is there).
std::string write_run(const std::string& run, Fixture& f, int world) {
  auto save_as = [&](int r) {
    ShardedSave s;
    auto cut = [&](const std::string& key, std::vector<int64_t> shape, std::vector<float>& v,
                   std::vector<model::TensorShard>& out) {
      const auto n = static_cast<int64_t>(v.size());
      const int64_t lo = n * r / world, hi = n * (r + 1) / world;
      if (hi > lo)
        out.push_back({key, shape, lo, hi - lo, 0, model::Sharding::zero_range, v.data() + lo});
    };
    cut("a", {6, 5}, f.a, s.model);
    cut("b", {7}, f.b, s.model);
    cut("a.exp_avg", {6, 5}, f.m, s.optimizer);
    s.state_json = kState;
    s.layout = {{"world", world}};
    SaveGroup g;
    g.rank = r;
    g.world = world;
    g.nonce = "test";
    return save_sharded(run, 5, s, g, 3);
  };
  for (int r = 1; r < world; ++r) save_as(r);
  return save_as(0);
}

fs::path scratch(const std::string& name) {
  const fs::path p = fs::path(testing::TempDir()) / ("anvil_sharded_" + name);
  fs::remove_all(p);
  return p;
}

TEST(Sharded, PiecesFromThreeRanksLoadWholeOrCutAnotherWay) {
  Fixture f;
  const std::string dir = write_run(scratch("three").string(), f, 3);
  EXPECT_TRUE(fs::exists(dir + "/index.json"));
  EXPECT_TRUE(fs::exists(dir + "/rank-00002.safetensors"));
  const auto model = read_tensors(dir, "model");
  ASSERT_EQ(model.size(), 2u);
  EXPECT_EQ(model.at("a").data, f.a);
  EXPECT_EQ(model.at("a").shape, (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(model.at("b").data, f.b);
  EXPECT_EQ(read_tensors(dir, "optimizer").at("a.exp_avg").data, f.m);
  // A piece that straddles two ranks' shards (elements 7..23 of a).
  std::vector<float> part(17, -1.0f);
  load_pieces(dir, {{"a", {6, 5}, 7, 17, 0, model::Sharding::replicated, part.data()}});
  EXPECT_EQ(part, std::vector<float>(f.a.begin() + 7, f.a.begin() + 24));
  const VerifyReport r = verify_checkpoint(dir);
  EXPECT_TRUE(r.problems.empty()) << r.problems.front();
  EXPECT_EQ(r.tensors, 3);
  EXPECT_EQ(r.shards, 9);
  // Reshaped to 2 ranks: the same tensors.
  const std::string two = reshape_checkpoint(dir, scratch("three_to_two").string(), 2);
  EXPECT_EQ(read_tensors(two, "model").at("a").data, f.a);
  EXPECT_EQ(read_tensors(two, "optimizer").at("a.exp_avg").data, f.m);
  EXPECT_TRUE(fs::exists(two + "/rank-00001.safetensors"));
  EXPECT_FALSE(fs::exists(two + "/rank-00002.safetensors"));
}

// A reshape writes each output rank's file as it reads the source's shards
// (nothing held whole): to 1 rank and to more ranks than a tensor has
// elements the tensors come back; a flipped byte in a shard that two output
// ranks read in turn is found by its checksum, and the failed reshape
// leaves no step or temporary directory behind.
TEST(Sharded, AReshapeStreamsTheShardsAndChecksTheirSums) {
  Fixture f;
  const std::string dir = write_run(scratch("stream_src").string(), f, 3);
  for (const int to : {1, 4, 11}) {
    SCOPED_TRACE(to);
    const std::string out =
        reshape_checkpoint(dir, scratch("stream_" + std::to_string(to)).string(), to);
    EXPECT_EQ(read_tensors(out, "model").at("a").data, f.a);
    EXPECT_EQ(read_tensors(out, "model").at("b").data, f.b);
    EXPECT_EQ(read_tensors(out, "optimizer").at("a.exp_avg").data, f.m);
    EXPECT_TRUE(verify_checkpoint(out).problems.empty());
    char last[32];
    std::snprintf(last, sizeof last, "/rank-%05d.safetensors", to - 1);
    EXPECT_TRUE(fs::exists(out + last));
  }
  // In key order a (30 elements), b (7), a.exp_avg (30): cut to 2 ranks,
  // output rank 0 takes the first 33, so source rank 1's shard of b
  // (elements 2..4) is read in turn by both; its element 3, which output
  // rank 1 reads after rank 0's file is written, is flipped.
  const nlohmann::json index = nlohmann::json::parse(read_file(dir + "/index.json"));
  uint64_t byte = 0;
  for (const auto& sh : index["tensors"]["b"]["shards"])
    if (sh["offset"] == 2 && sh["numel"] == 2) byte = sh["bytes"][0].get<uint64_t>() + 4;
  ASSERT_GT(byte, 0u);
  const fs::path damaged = scratch("stream_damaged");
  fs::copy(dir, damaged, fs::copy_options::recursive);
  {
    std::fstream file(damaged / "rank-00001.safetensors",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(byte));
    file.put('\x7f');
  }
  const fs::path run = scratch("stream_out");
  try {
    reshape_checkpoint(damaged.string(), run.string(), 2);
    FAIL() << "expected the damaged shard to be found";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("rank-00001.safetensors: tensor b (elements 2..4)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(!fs::exists(run) || fs::is_empty(run));
}

// A checkpoint copied or edited to another step name resumes at the step its
// files say, not the one its name says: verify names the disagreement.
TEST(Sharded, AStepThatDisagreesWithItsNameIsDamage) {
  Fixture f;
  const fs::path run = scratch("renamed");
  const std::string good = write_run(run.string(), f, 2);
  fs::copy(good, run / "step-00000011", fs::copy_options::recursive);
  const VerifyReport r = verify_checkpoint((run / "step-00000011").string());
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("not the step its directory is named for"), std::string::npos)
      << r.problems[0];
  EXPECT_TRUE(verify_checkpoint(good).problems.empty());
}

// A checkpoint intact on disk whose tensors are not its config's model
// (one missing, one reshaped to the same size, a stray optimizer tensor)
// would load into no model: verify names each against the config.
TEST(Sharded, VerifyChecksTheTensorsAgainstTheConfigsModel) {
  const std::string config_text =
      read_file(std::string(ANVIL_SOURCE_DIR) + "/configs/zaya-tiny.json");
  const model::ModelConfig c = model::parse_model_config(config_text, "zaya-tiny");
  const model::ModelFamily& family = model::model_family(c);
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  const model::ParamRegistry registry = family.registry(c);
  for (const auto& spec : registry.specs()) tensors.push_back({spec.name, spec.shape});
  for (const auto& extra : family.extra_state_shapes(c)) tensors.push_back(extra);
  std::vector<std::vector<float>> data;
  ShardedSave save;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    data.emplace_back(static_cast<size_t>(n), 0.5f);
    save.model.push_back({name, shape, 0, n, 0, model::Sharding::replicated, data.back().data()});
    data.emplace_back(static_cast<size_t>(n), 0.25f);
    save.optimizer.push_back(
        {name + ".exp_avg", shape, 0, n, 0, model::Sharding::replicated, data.back().data()});
  }
  auto state = nlohmann::json::parse(kState);
  state["config"] = nlohmann::json::parse(model::model_config_to_json(c));
  save.state_json = state.dump();
  SaveGroup g;
  const std::string dir = save_sharded(scratch("tensor_set").string(), 5, save, g, 3);
  const VerifyReport good = verify_checkpoint(dir, model_tensor_problems);
  EXPECT_TRUE(good.problems.empty()) << good.problems.front();
  EXPECT_TRUE(verify_checkpoint(dir).problems.empty());  // the files alone
  {
    // A config implying millions of tensors (4096 layers of 4096 experts)
    // is named, not built.
    auto huge = state;
    huge["config"]["n_layers"] = 4096;
    huge["config"]["n_experts"] = 4096;
    huge["config"]["top_k"] = 1;
    const std::string saved_state = read_file(dir + "/state.json");
    const std::string saved_index = read_file(dir + "/index.json");
    auto idx = nlohmann::json::parse(saved_index);
    idx["train_state"] = huge;
    write_file_atomic(dir + "/state.json", huge.dump());
    write_file_atomic(dir + "/index.json", idx.dump());
    const VerifyReport r = verify_checkpoint(dir, model_tensor_problems);
    ASSERT_EQ(r.problems.size(), 1u);
    EXPECT_NE(r.problems[0].find("its config implies up to"), std::string::npos) << r.problems[0];
    write_file_atomic(dir + "/state.json", saved_state);
    write_file_atomic(dir + "/index.json", saved_index);
  }

  // The index edited: the first matrix gone, a [rows, cols] matrix read as
  // [cols, rows], an optimizer tensor renamed to no parameter.
  auto index = nlohmann::json::parse(read_file(dir + "/index.json"));
  auto& t = index["tensors"];
  std::string gone, swapped;
  for (const auto& [name, shape] : tensors) {
    if (shape.size() != 2 || shape[0] == shape[1]) continue;
    if (gone.empty()) {
      gone = name;
    } else if (swapped.empty()) {
      swapped = name;
      break;
    }
  }
  ASSERT_FALSE(swapped.empty());
  t.erase(gone);
  t[swapped]["shape"] = {t[swapped]["shape"][1], t[swapped]["shape"][0]};
  t["model.norm.nothing.exp_avg"] = t[swapped + ".exp_avg"];
  t.erase(swapped + ".exp_avg");
  write_file_atomic(dir + "/index.json", index.dump());
  const VerifyReport r = verify_checkpoint(dir, model_tensor_problems);
  std::string all;
  for (const auto& p : r.problems) all += p + "\n";
  EXPECT_NE(all.find("tensor " + gone + " ["), std::string::npos) << all;
  EXPECT_NE(all.find(": missing"), std::string::npos) << all;
  EXPECT_NE(all.find("tensor " + swapped + ": shape ["), std::string::npos) << all;
  EXPECT_NE(all.find("the config's model has"), std::string::npos) << all;
  EXPECT_NE(all.find("model.norm.nothing.exp_avg: not a tensor of the config's model"),
            std::string::npos)
      << all;
  // The gone tensor's optimizer state now names no model tensor of the
  // index, but it is still one of the config's: only the three problems.
  EXPECT_EQ(r.problems.size(), 3u) << all;
}

TEST(Sharded, DamageIsNamedAndTheNewestIntactCheckpointIsUsed) {
  Fixture f;
  const fs::path run = scratch("damage");
  const std::string good = write_run(run.string(), f, 2);
  // A later step, then one byte of its data flipped.
  fs::copy(good, run / "step-00000009", fs::copy_options::recursive);
  const std::string bad = (run / "step-00000009").string();
  for (const char* file : {"/index.json", "/state.json"}) {  // the step it is named for
    auto j = nlohmann::json::parse(read_file(bad + file));
    j["step"] = 9;
    if (j.contains("train_state")) j["train_state"]["step"] = 9;
    write_file_atomic(bad + file, j.dump());
  }
  std::string bytes = read_file(bad + "/rank-00001.safetensors");
  bytes[bytes.size() - 3] ^= 0x11;
  write_file_atomic(bad + "/rank-00001.safetensors", bytes);
  const VerifyReport r = verify_checkpoint(bad);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("rank-00001.safetensors: tensor a.exp_avg"), std::string::npos)
      << r.problems[0];
  EXPECT_NE(r.problems[0].find("checksum mismatch"), std::string::npos) << r.problems[0];
  std::vector<std::string> warnings;
  EXPECT_EQ(newest_intact_checkpoint(run.string(),
                                     [&](const std::string& w) { warnings.push_back(w); }),
            good);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("step-00000009 is damaged"), std::string::npos) << warnings[0];
  std::vector<float> m(30);
  EXPECT_THROW(
      load_pieces(bad, {{"a.exp_avg", {6, 5}, 0, 30, 0, model::Sharding::replicated, m.data()}}),
      CorruptCheckpoint);
  EXPECT_THROW(newest_intact_checkpoint(bad, {}), CorruptCheckpoint);
  // Readers (eval, generate, export) take a run's newest intact checkpoint
  // as a resume does, and a checkpoint named outright as it is.
  warnings.clear();
  EXPECT_EQ(checkpoint_to_read(run.string(), [&](const std::string& w) { warnings.push_back(w); }),
            good);
  EXPECT_EQ(warnings.size(), 1u);
  EXPECT_EQ(checkpoint_to_read(bad), bad);
  // A short file; an index whose shards leave a hole.
  write_file_atomic(bad + "/rank-00001.safetensors", bytes.substr(0, bytes.size() / 2));
  test_support::expect_input_error([&] { load_pieces(bad, {{"a.exp_avg", {6, 5}, 0, 30, 0,
                                                     model::Sharding::replicated, m.data()}}); },
                           {bad + "/rank-00001.safetensors", "beyond the file's"});
  auto index = nlohmann::json::parse(read_file(good + "/index.json"));
  index["tensors"]["b"]["shards"].erase(0);
  write_file_atomic(bad + "/index.json", index.dump());
  std::vector<float> b(7);
  test_support::expect_input_error(
      [&] { load_pieces(bad, {{"b", {7}, 0, 7, 0, model::Sharding::replicated, b.data()}}); },
      {bad + "/index.json: tensor b", "missing"});
  // Wrong shape, absent tensor.
  test_support::expect_input_error(
      [&] { load_pieces(good, {{"b", {8}, 0, 8, 0, model::Sharding::replicated, b.data()}}); },
      {"tensor b has shape [7] (expected [8])"});
  test_support::expect_input_error(
      [&] { load_pieces(good, {{"c", {7}, 0, 7, 0, model::Sharding::replicated, b.data()}}); },
      {good + "/index.json: no tensor c"});
}

TEST(Sharded, VersionOneCheckpointsStillLoad) {
  Fixture f;
  const fs::path dir = scratch("v1") / "step-00000005";
  fs::create_directories(dir);
  write_safetensors((dir / "model.safetensors").string(),
                    {{"a", {6, 5}, f.a.data()}, {"b", {7}, f.b.data()}});
  write_safetensors((dir / "optimizer.safetensors").string(), {{"a.exp_avg", {6, 5}, f.m.data()}});
  write_file_atomic((dir / "state.json").string(), kState);
  EXPECT_EQ(read_tensors(dir.string(), "model").at("b").data, f.b);
  std::vector<float> m(10);
  load_pieces(dir.string(), {{"a.exp_avg", {6, 5}, 20, 10, 0, model::Sharding::replicated, m.data()}});
  EXPECT_EQ(m, std::vector<float>(f.m.begin() + 20, f.m.end()));
  const VerifyReport r = verify_checkpoint(dir.string());
  EXPECT_EQ(r.version, 1);
  EXPECT_TRUE(r.problems.empty());
}

TEST(Sharded, AnUncommittedSaveIsInvisibleAndCleanedUp) {
  Fixture f;
  const fs::path run = scratch("uncommitted");
  const std::string good = write_run(run.string(), f, 1);
  // A crashed job's temporary directory, as a kill mid-save leaves it.
  fs::create_directories(run / ".step-00000010.tmp-deadjob");
  write_file_atomic((run / ".step-00000010.tmp-deadjob" / "rank-00000.safetensors").string(), "x");
  EXPECT_EQ(resolve_checkpoint(run.string()), good);
  write_run(run.string(), f, 1);  // the next commit removes it
  EXPECT_FALSE(fs::exists(run / ".step-00000010.tmp-deadjob"));
}

}  // namespace
}  // namespace anvil::ckpt


namespace anvil::ckpt {
namespace {

// Fuzzing found these: a number too large for a double in a JSON header
// made nlohmann throw out_of_range, which the readers let escape (a crash
// instead of a one-line error).
TEST(Sharded, NumbersPastTheRangeOfADoubleAreErrorsNotCrashes) {
  const fs::path dir = scratch("overflow") / "step-00000001";
  fs::create_directories(dir);
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":7.7E08888888888})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header + std::string(4, '\0');
  write_file_atomic((dir / "model.safetensors").string(), bytes);
  test_support::expect_input_error([&] { read_safetensors((dir / "model.safetensors").string()); },
                                   {(dir / "model.safetensors").string(), "number overflow"});
  write_file_atomic((dir / "index.json").string(),
                    R"({"format": "anvil-checkpoint", "version": 2, "tensors": {"a": 31e43967976}})");
  std::vector<float> a(1);
  test_support::expect_input_error(
      [&] { load_pieces(dir.string(), {{"a", {1}, 0, 1, 0, model::Sharding::replicated, a.data()}}); },
      {(dir / "index.json").string(), "not valid JSON"});
}

}  // namespace
}  // namespace anvil::ckpt

namespace anvil::ckpt {
namespace {

// A checkpoint is data from somewhere else: every way its index could point
// a read outside the folder, at something that is not a file, or at bytes
// another shard already claims is refused with the file and the field named.
TEST(Sharded, HostileIndexesAreRefusedWithTheFieldNamed) {
  Fixture f;
  const fs::path run = scratch("hostile");
  const std::string good = write_run(run.string(), f, 2);
  const auto index = nlohmann::json::parse(read_file(good + "/index.json"));
  const fs::path outside = scratch("hostile_outside");
  fs::create_directories(outside);
  fs::copy_file(good + "/rank-00001.safetensors", outside / "rank-00001.safetensors");
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&, const fs::path&)> damage;
    std::vector<std::string> named;
  };
  auto shard = [](nlohmann::json& ix, const char* key, size_t i) -> nlohmann::json& {
    return ix["tensors"][key]["shards"][i];
  };
  const std::vector<Case> cases = {
      {"absolute",
       [&](nlohmann::json& ix, const fs::path&) {
         shard(ix, "a", 1)["file"] = (outside / "rank-00001.safetensors").string();
       },
       {"index.json: tensor a: shard file", "is an absolute path"}},
      {"parent",
       [&](nlohmann::json& ix, const fs::path&) { shard(ix, "a", 1)["file"] = ".."; },
       {"index.json: tensor a: shard file \"..\" is not a plain name"}},
      {"symlink-out",
       [&](nlohmann::json&, const fs::path& d) {
         fs::remove(d / "rank-00001.safetensors");
         fs::create_symlink(outside / "rank-00001.safetensors", d / "rank-00001.safetensors");
       },
       {"rank-00001.safetensors: a symlink to", "outside the checkpoint folder"}},
      {"fifo",
       [&](nlohmann::json&, const fs::path& d) {
         fs::remove(d / "rank-00001.safetensors");
         ASSERT_EQ(::mkfifo((d / "rank-00001.safetensors").c_str(), 0600), 0);
       },
       {"rank-00001.safetensors: not a regular file"}},
      {"duplicate-shard",
       [&](nlohmann::json& ix, const fs::path&) {
         ix["tensors"]["b"]["shards"].push_back(shard(ix, "b", 0));
       },
       {"index.json: tensor b", "written twice"}},
      {"overlap",
       [&](nlohmann::json& ix, const fs::path&) {
         // b's first shard re-pointed at bytes that hold a's elements.
         const uint64_t begin = shard(ix, "a", 0)["bytes"][0].get<uint64_t>();
         const uint64_t n = shard(ix, "b", 0)["numel"].get<uint64_t>();
         shard(ix, "b", 0)["bytes"] = {begin, begin + 4 * n};
         shard(ix, "b", 0)["file"] = shard(ix, "a", 0)["file"];
       },
       {"index.json: bytes", "of tensor", "overlap", "expected each byte in one shard"}},
      {"dtype",
       [&](nlohmann::json& ix, const fs::path&) { ix["tensors"]["a"]["dtype"] = "F64"; },
       {"index.json: tensor a: dtype \"F64\" (expected \"F32\")"}},
      {"kind",
       [&](nlohmann::json& ix, const fs::path&) { ix["tensors"]["b"]["kind"] = "grads"; },
       {"index.json: tensor b: kind \"grads\""}},
      {"world",
       [&](nlohmann::json& ix, const fs::path&) { ix["world"] = 0; },
       {"index.json: world is 0 (expected an integer >= 1)"}},
      {"step",
       [&](nlohmann::json& ix, const fs::path&) { ix["step"] = "5"; },
       {"index.json: step is \"5\" (expected an integer >= 0)"}},
  };
  for (const auto& c : cases) {
    const fs::path d = scratch("hostile_" + c.name) / "step-00000005";
    fs::create_directories(d.parent_path());
    fs::copy(good, d, fs::copy_options::recursive);
    nlohmann::json ix = index;
    c.damage(ix, d);
    write_file_atomic((d / "index.json").string(), ix.dump());
    std::vector<float> a(30);
    test_support::expect_input_error(
        [&] { load_pieces(d.string(), {{"a", {6, 5}, 0, 30, 0, model::Sharding::replicated, a.data()}}); },
        c.named);
    test_support::expect_input_error([&] { read_tensors(d.string(), "model"); }, c.named);
    const VerifyReport r = verify_checkpoint(d.string());
    ASSERT_FALSE(r.problems.empty()) << c.name;
    for (const auto& part : c.named)
      EXPECT_NE(r.problems.front().find(part), std::string::npos) << part << " not in " << r.problems.front();
  }
  // A symlink that stays inside the folder is a file of the checkpoint.
  const fs::path inside = scratch("hostile_inside") / "step-00000005";
  fs::create_directories(inside.parent_path());
  fs::copy(good, inside, fs::copy_options::recursive);
  fs::rename(inside / "rank-00001.safetensors", inside / "data-1");
  fs::create_symlink("data-1", inside / "rank-00001.safetensors");
  EXPECT_EQ(read_tensors(inside.string(), "model").at("a").data, f.a);
  // A key named twice: nlohmann would keep the last one silently.
  std::string text = read_file(good + "/index.json");
  const auto at = text.find("\"tensors\": {");
  ASSERT_NE(at, std::string::npos);
  const fs::path twice = scratch("hostile_twice") / "step-00000005";
  fs::create_directories(twice.parent_path());
  fs::copy(good, twice, fs::copy_options::recursive);
  const std::string b_entry = "\"b\": " + index["tensors"]["b"].dump() + ", ";
  write_file_atomic((twice / "index.json").string(),
                    text.substr(0, at + 12) + b_entry + text.substr(at + 12));
  test_support::expect_input_error([&] { read_tensors(twice.string(), "model"); },
                                   {"index.json: key tensors.b appears twice"});
  write_file_atomic((twice / "state.json").string(),
                    R"({"format": "anvil-train-state", "step": 5, "step": 6})");
  test_support::expect_input_error([&] { read_state(twice.string()); },
                                   {"state.json: key step appears twice"});
}

}  // namespace
}  // namespace anvil::ckpt
