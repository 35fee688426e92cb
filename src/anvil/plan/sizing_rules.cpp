#include "anvil/plan/sizing_rules.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "anvil/base/table.hpp"
#include "anvil/model/family.hpp"
#include "anvil/model/param_count.hpp"

namespace anvil::plan {
namespace {

using nlohmann::json;

int64_t round_to(int64_t v, int64_t multiple) {
  const int64_t r = (v + multiple / 2) / multiple * multiple;
  return std::max(multiple, r);
}

int64_t round_up(int64_t v, int64_t multiple) {
  return (v + multiple - 1) / multiple * multiple;
}

std::string shape_text(const std::string& name, int64_t m, int64_t n, int64_t k) {
  std::ostringstream s;
  s << name << " [" << m << " x " << n << " x " << k << "]";
  return s.str();
}

// The best efficiency a GEMM can reach on this profile: the plateau of the curve.
double plateau(const HwProfile& hw, const std::string& dtype) {
  const auto it = hw.gemm_efficiency.find(dtype);
  if (it == hw.gemm_efficiency.end() || it->second.empty()) return achievable_gemm(hw, dtype);
  double best = 0;
  for (const auto& p : it->second) best = std::max(best, p.efficiency);
  return best;
}

}  // namespace

const std::vector<RuleInfo>& rule_catalogue() {
  static const std::vector<RuleInfo> rules = {
      {"alignment",
       "Matrix dimensions that are not a multiple of the hardware's K step (128 bytes: 64 bf16 "
       "elements on MFMA/tensor cores; one vector register on a CPU) run padded or on slower "
       "edge kernels.",
       "Anthony et al. 2024, sec. 3-4 (dimensions divisible by 64 in fp16/bf16); ZAYA1 paper, "
       "MI300X GEMM sizing study"},
      {"tile quantization",
       "A GEMM's output is computed in fixed tiles; the last row/column of tiles is only partly "
       "useful, so an output dimension just above a tile multiple wastes up to a whole tile.",
       "Anthony et al. 2024, sec. 4.2 (tile quantization)"},
      {"wave quantization",
       "Tiles run in waves of one tile per compute unit (304 CUs on MI300X, 132 SMs on "
       "H100/H200); a tile count just above a multiple of the CU count leaves most units idle "
       "in the last wave.",
       "Anthony et al. 2024, sec. 4.2 (wave quantization); ZAYA1 paper (304 CUs)"},
      {"head dimension",
       "Attention kernels are fastest at head dimensions of 64 or 128 (a multiple of 64, at "
       "most 256 for flash-attention kernels); small heads make the per-head GEMMs thin.",
       "Anthony et al. 2024, sec. 5 (attention: h/a a multiple of 64 and large); ZAYA1 paper "
       "(head dim 128)"},
      {"GEMM work",
       "A GEMM needs enough work (FLOPs) to reach the plateau of the efficiency curve; below it "
       "launch, memory and edge costs dominate. Grow the batch (tokens) or the width.",
       "the profile's measured efficiency curve (anvil bench gemm / anvil hw --profile) or its "
       "memory roofline; ZAYA1 paper, GEMM sweeps"},
      {"expert width",
       "Each expert sees tokens x top_k / n_experts tokens per micro-batch; with many narrow "
       "experts the expert GEMMs become thin and memory bound. Fewer or wider experts, or a "
       "bigger micro-batch, restore the work per GEMM.",
       "ZAYA1 paper (MoE width chosen for training throughput and inference latency); "
       "Megatron-Core MoE grouped GEMM notes"},
      {"vocabulary padding",
       "The classifier GEMM's output width is the vocabulary; pad it to a multiple of 64 "
       "(128 bytes) as GPT-2's 50257 -> 50304.",
       "Anthony et al. 2024, sec. 6 (vocabulary size); llm.c (padded vocabulary)"},
  };
  return rules;
}

int64_t alignment_elements(const HwProfile& hw, const std::string& dtype) {
  const int64_t bytes = dtype == "f32" ? 4 : 2;
  return hw.kind == "gpu" ? 128 / bytes : 64 / bytes;
}

RuleResult check_alignment(const std::string& name, int64_t value, const HwProfile& hw,
                           const std::string& dtype) {
  const int64_t a = alignment_elements(hw, dtype);
  RuleResult r;
  r.rule = "alignment";
  r.subject = name + " = " + std::to_string(value);
  r.pass = value % a == 0;
  if (!r.pass) {
    r.loss = 1.0 - static_cast<double>(value) / static_cast<double>(round_up(value, a));
    r.suggestion = name + " = " + std::to_string(round_to(value, a));
  }
  r.detail = "multiple of " + std::to_string(a) + " (" + dtype + " on " + hw.name + ")";
  return r;
}

RuleResult check_gemm_quantization(const std::string& name, int64_t m, int64_t n, int64_t k,
                                   const HwProfile& hw, const std::string& dtype, bool wave) {
  const GemmPrice g = price_gemm(hw, dtype, m, n, k);
  RuleResult r;
  r.rule = wave ? "wave quantization" : "tile quantization";
  r.subject = shape_text(name, m, n, k);
  const double eff = wave ? g.wave : g.tile;
  const double threshold = wave ? 0.85 : 0.95;
  r.pass = eff >= threshold;
  r.loss = 1.0 - eff;
  std::ostringstream d;
  if (wave) {
    d << g.tiles << " tiles of " << kGpuTileM << "x" << kGpuTileN
      << (g.tiles < hw.compute_units ? " (split-K)" : "") << " in " << g.waves << " wave(s) of "
      << hw.compute_units << " " << hw.compute_unit_name << "s: wave efficiency "
      << fmt(g.wave * 100, 1) << "%";
  } else {
    d << "tile efficiency " << fmt(g.tile * 100, 1) << "% with " << kGpuTileM << "x" << kGpuTileN
      << " tiles";
  }
  r.detail = d.str();
  if (!r.pass) {
    // The nearest output width (n) within +-25% that clears the threshold.
    const int64_t step = alignment_elements(hw, dtype);
    for (int64_t delta = step; delta <= n / 4; delta += step) {
      for (int64_t cand : {n - delta, n + delta}) {
        if (cand <= 0 || !r.suggestion.empty()) continue;
        const GemmPrice c = price_gemm(hw, dtype, m, round_to(cand, step), k);
        if ((wave ? c.wave : c.tile) >= threshold)
          r.suggestion = "n = " + std::to_string(round_to(cand, step)) + " (" +
                         fmt((wave ? c.wave : c.tile) * 100, 1) + "%)";
      }
      if (!r.suggestion.empty()) break;
    }
  } else {
    r.loss = 0;
  }
  return r;
}

std::vector<RuleResult> check_sizing_rules(const model::ModelConfig& c, const HwProfile& hw,
                                           const Layout& l) {
  std::vector<RuleResult> out;
  const std::string& dt = l.dtype;
  out.push_back(check_alignment("d_model", c.d_model, hw, dt));
  out.push_back(check_alignment("n_heads x head_dim", c.n_heads * c.head_dim, hw, dt));
  out.push_back(check_alignment("n_kv_heads x head_dim", c.n_kv_heads * c.head_dim, hw, dt));
  if (c.n_experts == 0) {
    out.push_back(check_alignment("ffn_hidden", c.ffn_hidden, hw, dt));
  } else {
    out.push_back(check_alignment("expert_ffn_hidden", c.expert_ffn_hidden, hw, dt));
    if (c.router_dim > 0) out.push_back(check_alignment("router_dim", c.router_dim, hw, dt));
  }

  {  // Head dimension.
    RuleResult r;
    r.rule = "head dimension";
    r.subject = "head_dim = " + std::to_string(c.head_dim);
    r.pass = c.head_dim % 64 == 0 && c.head_dim <= 256;
    r.detail = "64 or 128 preferred";
    if (!r.pass) {
      const int64_t hd = c.head_dim < 96 ? 64 : 128;
      const int64_t heads = std::max<int64_t>(1, c.n_heads * c.head_dim / hd);
      r.suggestion =
          "head_dim = " + std::to_string(hd) + " with n_heads = " + std::to_string(heads);
      // Attention time scales with heads x head_dim; the loss is the per-head
      // GEMM efficiency at this head_dim against at the suggested one.
      const double e_now =
          curve_efficiency(hw, dt, 2.0 * static_cast<double>(l.seq * l.seq * c.head_dim));
      const double e_new = curve_efficiency(hw, dt, 2.0 * static_cast<double>(l.seq * l.seq * hd));
      r.loss = std::max(0.0, 1.0 - e_now / e_new);
    }
    out.push_back(r);
  }

  // Per-GEMM rules on the forward GEMMs of one micro-batch (backward GEMMs
  // share their dimensions).
  const double top = plateau(hw, dt);
  for (const auto& g : step_gemms(c, l, false)) {
    const auto& s = g.shape;
    if (hw.kind == "gpu") {
      out.push_back(check_gemm_quantization(s.name, s.m, s.n, s.k, hw, dt, false));
      out.push_back(check_gemm_quantization(s.name, s.m, s.n, s.k, hw, dt, true));
    }
    const GemmPrice p = price_gemm(hw, dt, s.m, s.n, s.k);
    const double base = std::min(p.curve, p.roofline);
    RuleResult r;
    r.rule = g.expert ? "expert width" : "GEMM work";
    r.subject = shape_text(s.name, s.m, s.n, s.k);
    r.pass = base >= 0.8 * top;
    std::ostringstream d;
    d << fmt(p.flops / 1e9, 3) << " GFLOP: " << fmt(base * 100, 1) << "% of peak (plateau "
      << fmt(top * 100, 1) << "%" << (p.roofline < p.curve ? ", memory bound" : "") << ")";
    if (g.expert) d << "; " << s.m << " tokens per expert per micro-batch";
    r.detail = d.str();
    if (!r.pass) {
      r.loss = 1.0 - base / top;
      const auto w = hw.work_for_90pct_flops.find(dt);
      if (g.expert) {
        r.suggestion =
            "more tokens per expert: micro-batch x top_k / n_experts higher, or "
            "fewer, wider experts";
      } else if (w != hw.work_for_90pct_flops.end()) {
        r.suggestion = ">= " + fmt(w->second / 1e9, 2) + " GFLOP per GEMM (90% of peak)";
      } else {
        r.suggestion = "more tokens per micro-batch or wider layers";
      }
    }
    out.push_back(r);
  }

  {  // Vocabulary padding.
    RuleResult r = check_alignment("vocab_size", c.vocab_size, hw, dt);
    r.rule = "vocabulary padding";
    if (!r.pass)
      r.suggestion =
          "vocab_size = " + std::to_string(round_up(c.vocab_size, alignment_elements(hw, dt)));
    out.push_back(r);
  }
  return out;
}

std::vector<Candidate> recommend(const model::ModelConfig& c, const HwProfile& hw,
                                 const PlanOptions& o, double budget_tolerance) {
  const model::ParamCount base = model::count_parameters(c);
  const double budget = static_cast<double>(base.non_embedding_total);
  const int64_t a = alignment_elements(hw, o.layout.dtype);
  const int64_t step = std::max<int64_t>(a, 64);
  std::vector<Candidate> out;
  std::set<std::string> seen;
  auto consider = [&](model::ModelConfig m, const std::string& change) {
    if (m.d_model < step || m.n_heads < 1 || m.n_kv_heads < 1 || m.n_heads % m.n_kv_heads) return;
    if (m.ffn_hidden < 1 || (m.n_experts > 0 && m.expert_ffn_hidden < 1)) return;
    if (o.layout.ep > 1 && m.n_experts % o.layout.ep) return;
    // A candidate the layout cannot split (--tp over its heads, --cp over
    // its sequence) is left out; the config as given was checked before.
    if (change != "as given") {
      try {
        validate_layout(m, o.layout);
      } catch (const InputError&) {
        return;
      }
    }
    const std::string key = model::model_config_to_json(m);
    if (!seen.insert(key).second) return;
    const model::ParamCount n = model::count_parameters(m);
    const double total = static_cast<double>(n.non_embedding_total);
    if (change != "as given" && std::abs(total / budget - 1) > budget_tolerance) return;
    Candidate cand;
    cand.config = m;
    cand.change = change;
    cand.non_embedding_total = total;
    cand.non_embedding_active = static_cast<double>(n.non_embedding_active);
    cand.prediction = predict_step(m, hw, o);
    // On the rank's view of the hardware, as predict_step prices batch 1.
    cand.decode_b32_s = decode_seconds_per_step(m, cpu_rank_view(hw, cpu_rank_share(hw, o.layout)),
                                                o.layout.dtype, o.layout.seq, kDecodeBatch);
    for (const auto& r : check_sizing_rules(m, hw, o.layout)) cand.warnings += r.pass ? 0 : 1;
    out.push_back(cand);
  };
  consider(c, "as given");
  const int64_t q = c.n_heads * c.head_dim;
  const int64_t group = std::max<int64_t>(1, c.n_heads / c.n_kv_heads);
  const bool moe = c.n_experts > 0;
  const int64_t fixed_kv = model::model_family(c).fixed_kv_heads();
  const int64_t width = moe ? c.expert_ffn_hidden : c.ffn_hidden;
  std::vector<int64_t> expert_counts = {c.n_experts};
  if (moe) expert_counts = {std::max<int64_t>(1, c.n_experts / 2), c.n_experts, c.n_experts * 2};
  for (int64_t dd = -4; dd <= 4; ++dd) {
    const int64_t d = round_to(c.d_model, step) + dd * step;
    if (d < step) continue;
    for (int64_t hd : {int64_t{64}, int64_t{128}}) {
      // Keep the attention width proportional to d_model, in whole KV groups.
      const int64_t q_new = std::max<int64_t>(hd * group, round_to(q * d / c.d_model, hd * group));
      for (int64_t e : expert_counts) {
        for (double f : {0.5, 0.75, 1.0, 1.25, 1.5, 2.0}) {
          model::ModelConfig m = c;
          m.d_model = d;
          m.head_dim = hd;
          m.n_heads = q_new / hd;
          // Some architectures fix the KV heads (CCA: current- and previous-token values).
          m.n_kv_heads = fixed_kv > 0 ? fixed_kv : std::max<int64_t>(1, m.n_heads / group);
          if (m.n_heads % m.n_kv_heads != 0) continue;
          if (c.rotary_dim > 0) m.rotary_dim = std::min(hd, c.rotary_dim * hd / c.head_dim);
          // Scale the width so the budget holds when the expert count changes.
          const double scale =
              moe ? f * static_cast<double>(c.n_experts) / static_cast<double>(e) : f;
          const int64_t w = round_to(
              static_cast<int64_t>(static_cast<double>(width) * scale *
                                   static_cast<double>(c.d_model) / static_cast<double>(d)),
              step);
          if (moe) {
            m.n_experts = e;
            m.expert_ffn_hidden = w;
          } else {
            m.ffn_hidden = w;
          }
          std::ostringstream ch;
          ch << "d " << d << ", heads " << m.n_heads << "x" << hd << " (kv " << m.n_kv_heads
             << "), " << (moe ? "experts " + std::to_string(e) + " x " : "ffn ") << w;
          consider(m, ch.str());
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& x, const Candidate& y) {
    return x.prediction.tokens_per_s > y.prediction.tokens_per_s;
  });
  for (auto& x : out) {
    x.pareto =
        std::none_of(out.begin(), out.end(), [&](const Candidate& y) { return dominates(y, x); });
  }
  return out;
}

bool dominates(const Candidate& y, const Candidate& x) {
  const bool no_worse = y.prediction.tokens_per_s >= x.prediction.tokens_per_s &&
                        y.prediction.decode_s_per_token <= x.prediction.decode_s_per_token &&
                        y.decode_b32_s <= x.decode_b32_s;
  const bool better = y.prediction.tokens_per_s > x.prediction.tokens_per_s ||
                      y.prediction.decode_s_per_token < x.prediction.decode_s_per_token ||
                      y.decode_b32_s < x.decode_b32_s;
  return no_worse && better;
}

std::string pareto_text(const std::vector<Candidate>& cs) {
  std::ostringstream s;
  Table t({"config", "pred tokens/s", "decode b1 ms", "decode b32 ms/step", "active (B)"});
  size_t n = 0;
  for (const auto& c : cs) {
    if (!c.pareto) continue;
    ++n;
    t.add_row({c.change, fmt(c.prediction.tokens_per_s, 1),
               fmt(c.prediction.decode_s_per_token * 1e3, 3), fmt(c.decode_b32_s * 1e3, 3),
               fmt(c.non_embedding_active / 1e9, 4)});
  }
  s << "# Pareto front: training tokens/s against decode latency at batch 1 and " << kDecodeBatch
    << " (" << n << " of " << cs.size() << ")\n"
    << t.to_text();
  // Where the given shape sits, and why.
  const auto given =
      std::find_if(cs.begin(), cs.end(), [](const Candidate& c) { return c.change == "as given"; });
  if (given == cs.end()) return s.str();
  const auto rank = given - cs.begin() + 1;
  s << "as given: training rank " << rank << " of " << cs.size() << ", ";
  if (given->pareto) {
    s << "on the front: no nearby shape trains faster without decoding slower at batch 1 or "
      << kDecodeBatch << "\n";
    return s.str();
  }
  // The dominating shape that trains fastest, with the margins.
  const Candidate* best = nullptr;
  size_t dominated_by = 0;
  for (const auto& c : cs) {
    if (!dominates(c, *given)) continue;
    ++dominated_by;
    if (!best || c.prediction.tokens_per_s > best->prediction.tokens_per_s) best = &c;
  }
  s << "dominated by " << dominated_by << ", e.g. " << best->change << ": training "
    << fmt((best->prediction.tokens_per_s / given->prediction.tokens_per_s - 1) * 100, 1)
    << "% faster, decode b1 "
    << fmt((1 - best->prediction.decode_s_per_token / given->prediction.decode_s_per_token) * 100,
           1)
    << "% and b" << kDecodeBatch << " "
    << fmt((1 - best->decode_b32_s / given->decode_b32_s) * 100, 1) << "% lower\n";
  return s.str();
}

std::string rules_text(const std::vector<RuleResult>& rules) {
  Table t({"rule", "subject", "result", "time lost", "suggestion", "detail"});
  int warns = 0;
  for (const auto& r : rules) {
    warns += r.pass ? 0 : 1;
    t.add_row({r.rule, r.subject, r.pass ? "pass" : "WARN",
               r.pass ? "" : fmt(r.loss * 100, 1) + "%", r.suggestion, r.detail});
  }
  std::ostringstream s;
  s << t.to_text() << rules.size() << " checks, " << warns << " warning(s)\nrules:\n";
  for (const auto& info : rule_catalogue())
    s << "  " << info.rule << ": " << info.why << " [" << info.source << "]\n";
  return s.str();
}

std::string rules_json(const std::vector<RuleResult>& rules) {
  json a = json::array();
  for (const auto& r : rules) {
    std::string why, source;
    for (const auto& info : rule_catalogue()) {
      if (info.rule == r.rule) {
        why = info.why;
        source = info.source;
      }
    }
    a.push_back({{"rule", r.rule},
                 {"subject", r.subject},
                 {"pass", r.pass},
                 {"loss", r.loss},
                 {"suggestion", r.suggestion},
                 {"detail", r.detail},
                 {"why", why},
                 {"source", source}});
  }
  return a.dump(2) + "\n";
}

std::string candidates_text(const std::vector<Candidate>& cs, size_t top) {
  Table t({"rank", "config", "non-emb total (B)", "active (B)", "pred tokens/s", "MFU",
           "decode b1 ms", "decode b32 ms/step", "Pareto", "warnings"});
  for (size_t i = 0; i < cs.size() && i < top; ++i) {
    const auto& c = cs[i];
    t.add_row({std::to_string(i + 1), c.change, fmt(c.non_embedding_total / 1e9, 4),
               fmt(c.non_embedding_active / 1e9, 4), fmt(c.prediction.tokens_per_s, 1),
               fmt(c.prediction.mfu * 100, 1) + "%", fmt(c.prediction.decode_s_per_token * 1e3, 3),
               fmt(c.decode_b32_s * 1e3, 3), c.pareto ? "*" : "", std::to_string(c.warnings)});
  }
  std::ostringstream s;
  s << "# nearby configs within the parameter budget, best predicted training throughput first ("
    << cs.size() << " searched)\n"
    << t.to_text() << "\n"
    << pareto_text(cs);
  return s.str();
}

std::string candidates_json(const std::vector<Candidate>& cs, size_t top) {
  json a = json::array();
  for (size_t i = 0; i < cs.size(); ++i) {
    const auto& c = cs[i];
    if (i >= top && !c.pareto && c.change != "as given")
      continue;  // the front and the input always
    a.push_back({{"rank", i + 1},
                 {"change", c.change},
                 {"config", json::parse(model::model_config_to_json(c.config))},
                 {"non_embedding_total", c.non_embedding_total},
                 {"non_embedding_active", c.non_embedding_active},
                 {"tokens_per_s", c.prediction.tokens_per_s},
                 {"mfu", c.prediction.mfu},
                 {"step_s", c.prediction.step_s},
                 {"decode_s_per_token", c.prediction.decode_s_per_token},
                 {"decode_b1_s", c.prediction.decode_s_per_token},
                 {"decode_b32_s", c.decode_b32_s},
                 {"pareto", c.pareto},
                 {"warnings", c.warnings}});
  }
  return a.dump(2) + "\n";
}

}  // namespace anvil::plan
