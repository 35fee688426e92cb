#include "anvil/ckpt/export.hpp"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/ckpt/checkpoint.hpp"
#include "anvil/ckpt/safetensors.hpp"
#include "anvil/ckpt/sharded.hpp"
#include "anvil/model/config.hpp"

namespace anvil::ckpt {
namespace fs = std::filesystem;

namespace {

// transformers' ZayaConfig keys for an anvil ZAYA1 config.
nlohmann::json zaya_hf_config(const model::ModelConfig& c) {
  const double rotary = c.rotary_dim > 0 ? static_cast<double>(c.rotary_dim) / c.head_dim : 1.0;
  return {{"architectures", {"ZayaForCausalLM"}},
          {"model_type", "zaya"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},
          {"max_position_embeddings", c.seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"tie_word_embeddings", c.tied_embeddings},
          {"moe_intermediate_size", c.expert_ffn_hidden},
          {"num_experts", c.n_experts},
          {"num_experts_per_tok", c.top_k},
          {"router_hidden_size", c.router_dim},
          {"cca_time0", 2},
          {"cca_time1", 2},
          {"attention_bias", false},
          {"lm_head_bias", false},
          {"rope_parameters",
           {{"hybrid",
             {{"rope_type", "default"},
              {"rope_theta", c.rope_theta},
              {"partial_rotary_factor", rotary}}}}},
          {"torch_dtype", "float32"},
          {"anvil_config", nlohmann::json::parse(model::model_config_to_json(c))}};
}

}  // namespace

ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir) {
  const std::string dir = resolve_checkpoint(checkpoint);
  const auto state = read_state(dir);
  const model::ModelConfig config =
      model::parse_model_config(state.at("config").dump(), dir + "/state.json");
  if (config.attention != "cca") {
    throw InputError("--hf: " + dir + " holds a " + config.attention +
                     " decoder; the Hugging Face export covers ZAYA1 (attention cca) checkpoints");
  }
  std::error_code ec;
  if (fs::exists(out_dir, ec))
    throw InputError("--out: " + out_dir + " exists; expected a new directory");
  SafetensorsFile weights;
  weights.path = dir;
  weights.tensors = read_tensors(dir, "model");
  const fs::path target = fs::absolute(out_dir);
  // (Built with append: GCC 12 warns falsely on "." + std::string.)
  std::string tmp_name = ".";
  tmp_name.append(target.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
  const fs::path tmp = target.parent_path() / tmp_name;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw SystemError(tmp.string() + ": cannot create directory: " + ec.message());
  ExportResult r;
  try {
    std::vector<TensorRef> refs;
    for (const auto& [name, t] : weights.tensors) {
      refs.push_back({name, t.shape, t.data.data()});
      ++r.tensors;
      r.parameters += static_cast<int64_t>(t.data.size());
    }
    write_safetensors((tmp / "model.safetensors").string(), refs,
                      {{"format", "pt"}, {"source", "anvil " + dir}});
    write_file_atomic((tmp / "config.json").string(), zaya_hf_config(config).dump(2) + "\n");
    fsync_directory(tmp.string());
    fs::rename(tmp, target, ec);
    if (ec) throw SystemError(target.string() + ": cannot rename into place: " + ec.message());
    fsync_directory(target.parent_path().string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  r.out_dir = target.string();
  return r;
}

}  // namespace anvil::ckpt
