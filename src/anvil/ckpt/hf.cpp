// Export and import through the config family's Hugging Face adapter
// (hf_adapter.hpp): the tensors moved, concatenated, stacked or transposed
// as its map says, config.json written and read through its key table,
// the run's tokenizer as tokenizer.json, everything written whole or not
// at all.
#include "anvil/ckpt/hf.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <vector>

#include "anvil/base/bf16.hpp"
#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/json_text.hpp"
#include "anvil/base/progress.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/hf_adapter.hpp"
#include "anvil/ckpt/hf_files.hpp"
#include "anvil/ckpt/model_tensors.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/data/tokenizer_json.hpp"
#include "anvil/model/config.hpp"
#include "anvil/model/family.hpp"

namespace anvil::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// Every anvil model tensor of `c` with its shape: the registry plus the
// family's model state outside it.
Shapes anvil_shapes(const model::ModelConfig& c) {
  const model::ModelFamily& family = model::model_family(c);
  Shapes s;
  const model::ParamRegistry registry = family.registry(c);
  for (const auto& spec : registry.specs()) s[spec.name] = spec.shape;
  for (const auto& [name, shape] : family.extra_state_shapes(c)) s[name] = shape;
  return s;
}

// An original layout: anvil's own names.
std::vector<HfTensor> identity_map(const Shapes& shapes) {
  std::vector<HfTensor> m;
  for (const auto& [name, shape] : shapes) m.push_back({name, {name}});
  return m;
}

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// The transformers shape of `t` from its parts' shapes.
std::vector<int64_t> mapped_shape(const HfTensor& t, const Shapes& shapes) {
  std::vector<int64_t> first = shapes.at(t.parts.front()), shape;
  if (t.stack) {
    shape.push_back(static_cast<int64_t>(t.parts.size()));
    shape.insert(shape.end(), first.begin(), first.end());
    return shape;
  }
  shape = first;
  for (size_t i = 1; i < t.parts.size(); ++i) shape[0] += shapes.at(t.parts[i])[0];
  if (t.transpose) {
    const int64_t rows = shape[0], cols = count(shape) / rows;
    shape = {cols, rows};
  }
  return shape;
}

void transpose(float* out, const float* in, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) out[k * rows + r] = in[r * cols + k];
}

// config.json: the architecture's keys and what every export writes.
json export_config(const model::ModelConfig& c, const HfArchitecture& arch,
                   const HfOriginalLayout* original, const std::string& dtype, const json& anvil) {
  json j = hf_config_keys(arch, c);
  j["architectures"] = {arch.name};
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  // anvil's tokenizers have no special tokens: none is claimed (an eos id
  // would stop greedy generation early).
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["pad_token_id"] = nullptr;
  j["dtype"] = dtype;
  j["anvil"] = anvil;
  return original ? original->config(c, std::move(j)) : j;
}

// The values of an export's tensors, made one at a time as the files are
// written: a tensor's anvil parts are read from the checkpoint when the
// writer reaches it, concatenated (or stacked), transposed and rounded as
// the map says, and released when the next one is made. The export holds
// one tensor (twice while it is transposed), not the model.
class ExportValues {
 public:
  ExportValues(const std::string& dir, const std::vector<HfTensor>& map, const Shapes& shapes,
               bool bf16)
      : checkpoint_(std::make_shared<PieceReader>(dir)), map_(map), shapes_(shapes), bf16_(bf16) {}

  void operator()(size_t tensor, uint64_t at, char* dst, size_t n) {
    if (held_ != tensor) make(tensor);
    const char* from = bf16_ ? reinterpret_cast<const char*>(b16_.data())
                             : reinterpret_cast<const char*>(f32_.data());
    std::memcpy(dst, from + at, n);
  }

 private:
  void make(size_t tensor) {
    std::vector<float>().swap(f32_);  // the last one goes before the next comes
    std::vector<uint16_t>().swap(b16_);
    held_ = SIZE_MAX;
    const HfTensor& t = map_[tensor];
    int64_t numel = 0;
    for (const auto& part : t.parts) numel += count(shapes_.at(part));
    std::vector<float> cat(static_cast<size_t>(numel));
    std::vector<model::TensorShard> want;
    int64_t at = 0;
    for (const auto& part : t.parts) {
      const auto& shape = shapes_.at(part);
      want.push_back(
          {part, shape, 0, count(shape), 0, model::Sharding::replicated, cat.data() + at});
      at += count(shape);
    }
    checkpoint_->load(want);
    if (t.transpose) {
      const auto shape = mapped_shape(t, shapes_);
      f32_.resize(cat.size());
      transpose(f32_.data(), cat.data(), shape[1], shape[0]);
    } else {
      f32_ = std::move(cat);
    }
    if (bf16_) {
      b16_.resize(f32_.size());
      for (size_t i = 0; i < f32_.size(); ++i) b16_[i] = to_bf16(f32_[i]).bits;
      std::vector<float>().swap(f32_);
    }
    held_ = tensor;
  }

  std::shared_ptr<const PieceReader> checkpoint_;  // shared by the std::function copies
  const std::vector<HfTensor>& map_;
  const Shapes& shapes_;
  bool bf16_;
  size_t held_ = SIZE_MAX;
  std::vector<float> f32_;
  std::vector<uint16_t> b16_;
};

// The run's tokenizer, where transformers has an exact equivalent.
void write_tokenizer(const fs::path& dir, const std::string& checkpoint, const json& state,
                     const model::ModelConfig& config) {
  json tokenizer;
  if (state.value("tokenizer", "") == "bytes" && config.vocab_size >= 256) {
    tokenizer = data::bytes_tokenizer_json();
  } else if (state.value("tokenizer", "") == "sentencepiece") {
    const std::string model = tokenizer_model(checkpoint);
    if (!model.empty()) {
      tokenizer = data::sentencepiece_tokenizer_json(model);
      fs::copy_file(model, dir / kTokenizerFile);
    }
    if (tokenizer.is_null())
      std::fprintf(stderr,
                   "anvil: warning: %s: no tokenizer.json written (a SentencePiece "
                   "BPE model is needed)\n",
                   checkpoint.c_str());
  }
  if (tokenizer.is_null()) return;
  write_file_atomic((dir / "tokenizer.json").string(), tokenizer.dump() + "\n");
  const json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                   {"model_max_length", config.seq_len},
                   {"clean_up_tokenization_spaces", false}};
  write_file_atomic((dir / "tokenizer_config.json").string(), tc.dump(2) + "\n");
}

// The original layout of some family, for messages: "ZAYA1".
std::string original_layout_owners() {
  std::string owners;
  for (const HfAdapter* a : hf_adapters())
    if (a->original) owners += (owners.empty() ? "" : " or ") + a->original->owner;
  return owners;
}

}  // namespace

ExportResult export_checkpoint(const ExportOptions& o) {
  if (o.format != "hf" && o.format != "original")
    throw InputError("--format: " + o.format + " (expected hf or original)");
  if (o.dtype != "float32" && o.dtype != "bfloat16")
    throw InputError("--dtype: " + o.dtype + " (expected float32 or bfloat16)");
  if (o.max_shard_bytes < 1) throw InputError("--max-shard-size: expected > 0 bytes");
  const std::string dir = checkpoint_to_read(o.checkpoint, {}, model_tensor_problems);
  const auto state = read_state(dir);
  const model::ModelConfig config =
      model::parse_model_config(state.at("config").dump(), dir + "/state.json");
  const HfAdapter& adapter = hf_adapter(config.family);
  const HfOriginalLayout* original = o.format == "original" ? adapter.original : nullptr;
  if (o.format == "original" && !original)
    throw InputError("--format original: " + dir + " is a " + model::to_string(config.family) +
                     " model; that layout is " + original_layout_owners() + "'s");
  const HfArchitecture& arch = original ? *original->architecture : adapter.choose(config, dir);
  std::error_code ec;
  if (fs::exists(o.out_dir, ec))
    throw InputError("--out: " + o.out_dir + " exists; expected a new directory");

  const Shapes shapes = tensor_shapes(dir, "model");
  const auto expected = anvil_shapes(config);
  for (const auto& [name, shape] : expected) {
    const auto it = shapes.find(name);
    if (it == shapes.end() || it->second != shape)
      throw InputError(dir + ": tensor " + name + " missing or of another shape than its config's");
  }
  const std::vector<HfTensor> map = original ? identity_map(expected) : arch.tensors(config);
  std::vector<HfOutTensor> out;
  for (const auto& t : map) out.push_back({t.name, mapped_shape(t, shapes)});
  ExportResult r;
  for (const auto& x : out) r.parameters += count(x.shape);
  r.tensors = static_cast<int64_t>(out.size());
  const bool bf16 = o.dtype == "bfloat16";
  const json anvil = {{"config", json::parse(model::model_config_to_json(config))},
                      {"tokenizer", state.value("tokenizer", "random")},
                      {"step", state.at("step")},
                      {"source", dir},
                      {"format", o.format}};
  const fs::path target = fs::absolute(o.out_dir);
  write_directory(target, [&](const fs::path& tmp) {
    r.files =
        write_hf_weights(tmp, out, o.max_shard_bytes, bf16, ExportValues(dir, map, shapes, bf16));
    const json cfg = export_config(config, arch, original, o.dtype, anvil);
    write_file_atomic((tmp / "config.json").string(), cfg.dump(2) + "\n");
    write_tokenizer(tmp, dir, state, config);
  });
  r.out_dir = target.string();
  r.architecture = original ? original->owner + " original layout" : arch.name;
  return r;
}

namespace {

// The architecture config.json names, from every family's adapter.
const HfArchitecture& architecture_named(const json& j, const std::string& path,
                                         const HfAdapter*& adapter) {
  std::vector<std::string> names;
  for (const HfAdapter* a : hf_adapters())
    for (const HfArchitecture* arch : a->architectures) names.push_back(arch->name);
  auto listed = [&](const std::string& open, const std::string& close) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i)
      s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + open + names[i] + close;
    return s;
  };
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string())
    throw InputError(path + ": no architectures list (expected " + listed("[\"", "\"]") + ")");
  const std::string name = j["architectures"][0].get<std::string>();
  for (const HfAdapter* a : hf_adapters()) {
    for (const HfArchitecture* arch : a->architectures) {
      if (arch->name != name) continue;
      adapter = a;
      return *arch;
    }
  }
  throw InputError(path + ": architecture " + name + " (expected " + listed("", "") + ")");
}

// Buffers transformers (or older checkpoints) store that carry no weight.
bool ignorable(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const std::string e = s;
    return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with("rotary_emb.inv_freq");
}

// The original layout the weights' names show, of any family; null: transformers'.
const HfOriginalLayout* original_layout_of(const Shapes& weights) {
  for (const HfAdapter* a : hf_adapters()) {
    if (!a->original) continue;
    for (const auto& [name, shape] : weights)
      if (a->original->shows(name)) return a->original;
  }
  return nullptr;
}

// Where an anvil model tensor's values come from: elements [offset, offset +
// numel) of a checkpoint tensor, transposed first ([rows, cols] read) when
// the map says so.
struct Source {
  std::string tensor;
  bool transpose = false;
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;
};

// Writes RUN/step-00000000 (weights only, one rank writes everything) and
// RUN/model-config.json. Each checkpoint tensor is read as the file reaches
// it and released after: the import holds one of them (twice while it is
// transposed), not the model.
void write_imported(const std::string& run_dir, const model::ModelConfig& c,
                    const std::map<std::string, Source>& sources, const HfWeights& weights,
                    const Shapes& shapes, const json& hf_config, const fs::path& hf_dir,
                    const std::string& architecture, ImportResult& r) {
  const auto registry = model::model_family(c).registry(c);
  ShardedSave save;
  std::vector<const Source*> source_of;  // by piece
  auto add = [&](const std::string& name, model::Sharding sharding) {
    const auto it = sources.find(name);
    if (it == sources.end())
      throw std::logic_error("ckpt import: no checkpoint tensor maps to " + name);
    save.model.push_back({name, shapes.at(name), 0, count(shapes.at(name)), 0, sharding, nullptr});
    source_of.push_back(&it->second);
  };
  for (const auto& spec : registry.specs()) add(spec.name, spec.sharding);
  for (const auto& [name, source] : sources)
    if (!registry.find(name)) add(name, model::Sharding::replicated);
  int64_t total = 0;
  for (const auto& p : save.model) total += p.numel;
  const auto total_mib = static_cast<size_t>((static_cast<uint64_t>(total) * sizeof(float)) >> 20);
  const bool show = total_mib >= 64;
  uint64_t written = 0;  // bytes, for the progress line
  std::string held;      // the checkpoint tensor in `values` (transposed where asked)
  std::vector<float> values;
  save.fill = [&](size_t piece, uint64_t at, char* dst, size_t n) {
    const Source& s = *source_of[piece];
    if (held != s.tensor) {
      std::vector<float>().swap(values);  // the last one goes before the next comes
      held.clear();
      values = weights.read(s.tensor).data;
      if (s.transpose) {
        std::vector<float> back(values.size());
        transpose(back.data(), values.data(), s.rows, s.cols);
        values = std::move(back);
      }
      held = s.tensor;
    }
    std::memcpy(dst, values.data() + s.offset + static_cast<int64_t>(at / sizeof(float)), n);
    if (((written + n) >> 20) != (written >> 20))  // a line per MiB at most
      progress_line(show, std::min(static_cast<size_t>((written + n) >> 20), total_mib - 1),
                    total_mib, "MiB of " + run_dir + " written");
    written += n;
  };
  std::string tokenizer = "random";
  if (hf_config.contains("anvil") && hf_config["anvil"].is_object())
    tokenizer = hf_config["anvil"].value("tokenizer", tokenizer);
  const json state = {{"format", "anvil-train-state"},
                      {"version", 1},
                      {"step", 0},
                      {"config", json::parse(model::model_config_to_json(c))},
                      {"seed", 0},
                      {"batch", 1},
                      {"seq", c.seq_len},
                      {"accum", 1},
                      {"tokenizer", tokenizer},
                      {"weights_only", true},
                      {"imported_from", fs::absolute(hf_dir).string()},
                      {"architecture", architecture}};
  save.state_json = state.dump(2) + "\n";
  save.layout = {{"world", 1}, {"zero", false}, {"ep", 1}, {"optimizer", "none"}};
  // The run directory is made whole under a temporary name and renamed
  // (write_directory): an interrupted import leaves no half run that would
  // block the next one.
  std::error_code ec;
  if (fs::exists(run_dir, ec)) fs::remove(run_dir, ec);  // empty (checked before)
  write_directory(run_dir, [&](const fs::path& tmp) {
    save_sharded(tmp.string(), 0, save, SaveGroup{}, 1);
    progress_line(show, total_mib, total_mib, "");
    // An anvil export's SentencePiece model comes back to the run directory,
    // where eval and generate look for it (as a trained run keeps it).
    if (tokenizer == "sentencepiece" && fs::exists(hf_dir / kTokenizerFile))
      write_file_atomic((tmp / kTokenizerFile).string(),
                        read_file((hf_dir / kTokenizerFile).string()));
    write_file_atomic((tmp / "model-config.json").string(), model::model_config_to_json(c) + "\n");
  });
  r.checkpoint_dir = (fs::path(run_dir) / checkpoint_name(0)).string();
  r.config_path = (fs::path(run_dir) / "model-config.json").string();
}

}  // namespace

ImportResult import_hf(const std::string& hf_dir, const std::string& run_dir) {
  const fs::path dir(hf_dir);
  const std::string config_path = (dir / "config.json").string();
  const json j = parse_json_unique(read_file(config_path), config_path);
  if (!j.is_object()) throw InputError(config_path + ": expected a JSON object");
  std::error_code ec;
  if (fs::exists(run_dir, ec) && !fs::is_empty(run_dir, ec))
    throw InputError("--out: " + run_dir +
                     " exists and is not empty; expected a new run directory");
  const HfWeights weights(dir);
  const HfOriginalLayout* original = original_layout_of(weights.shapes());
  const HfAdapter* adapter = nullptr;
  const HfArchitecture& arch = architecture_named(j, config_path, adapter);
  model::ModelConfig c;
  try {
    // The exact config anvil put there on export, else transformers' keys.
    const bool exact =
        j.contains("anvil") && j["anvil"].is_object() && j["anvil"].contains("config");
    if (exact)
      c = model::parse_model_config(j["anvil"]["config"].dump(), config_path + ": anvil.config");
    else
      c = config_from_hf_keys(arch, {j, original != nullptr}, config_path);
    // ZAYA1's skip class: transformers' port outputs 0 for it; the original
    // model, whose layout Zyphra's own checkpoints keep, gate * x.
    if (!exact && original && c.family == model::Family::zaya1)
      c.skip_output = model::SkipOutput::input;
  } catch (const json::exception& e) {
    throw InputError(config_path + ": " + e.what());
  }
  if (original && original != adapter->original)
    throw InputError(hf_dir + ": " + original->owner + " original-layout tensors under a " +
                     arch.name + " config.json");
  const auto shapes = anvil_shapes(c);
  const auto map = original ? identity_map(shapes) : arch.tensors(c);
  // GPT-2 checkpoints from the Hub name tensors without the "transformer." prefix.
  const Shapes& present = weights.shapes();
  auto find = [&](const std::string& name) {
    auto it = present.find(name);
    if (it == present.end() && name.rfind("transformer.", 0) == 0)
      it = present.find(name.substr(12));
    return it;
  };
  // Every tensor is checked (present, shaped as the config says, none left
  // over) before anything is written; the values are read while writing.
  std::map<std::string, Source> sources;
  std::set<std::string> used;
  ImportResult r;
  for (const auto& t : map) {
    const auto it = find(t.name);
    if (it == present.end())
      throw InputError(hf_dir + ": tensor " + t.name + " is missing (expected by " + arch.name +
                       ")");
    const auto want = mapped_shape(t, shapes);
    if (it->second != want) {
      json got = it->second, exp = want;
      throw InputError(hf_dir + ": tensor " + t.name + " has shape " + got.dump() + " (expected " +
                       exp.dump() + " from config.json)");
    }
    used.insert(it->first);
    int64_t at = 0;
    for (const auto& part : t.parts) {
      Source& s = sources[part];
      s.tensor = it->first;
      s.transpose = t.transpose;
      if (t.transpose) {
        s.rows = want[0];
        s.cols = want[1];
      }
      s.offset = at;
      at += count(shapes.at(part));
    }
    ++r.tensors;
    r.parameters += count(want);
  }
  for (const auto& [name, shape] : present) {
    if (used.count(name) > 0 || ignorable(name)) continue;
    if (name == "lm_head.weight" && c.tied_embeddings) continue;  // the tied copy
    throw InputError(hf_dir + ": unexpected tensor " + name + " (not part of " + arch.name +
                     " as its config.json describes it)");
  }
  r.architecture = original ? original->owner + " original layout" : arch.name;
  if (c.family == model::Family::zaya1)
    r.note = c.skip_output == model::SkipOutput::input
                 ? "the skip class outputs gate * x (skip_output input, the original model's)"
                 : "the skip class outputs 0 (skip_output zero, transformers' port)";
  write_imported(run_dir, c, sources, weights, shapes, j, dir, arch.name, r);
  return r;
}

}  // namespace anvil::ckpt
