#include "anvil/plan/perf_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "anvil/base/error.hpp"
#include "anvil/base/table.hpp"
#include "anvil/optim/muon.hpp"

namespace anvil::plan {
namespace {

using nlohmann::json;

double bytes_of(const std::string& dtype) {
  return dtype == "f32" ? 4.0 : 2.0;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

double peak_or_throw(const HwProfile& hw, const std::string& dtype) {
  const double peak = hw.peak_gflops(dtype);
  if (!(peak > 0))
    throw InputError("hardware profile " + hw.name + ": no peak[" + dtype +
                     "] figure; expected one of the dtypes it lists");
  return peak;
}

// Piecewise-linear interpolation in log(x) over points sorted by x
// ({x, y}); y in log space too when log_y. Clamped to the end values when
// `clamp`, else 0 outside [x_first, x_last].
double interpolate_log_x(std::vector<std::pair<double, double>> pts, double x, bool log_y,
                         bool clamp) {
  if (pts.empty()) return 0;
  std::sort(pts.begin(), pts.end());
  if (x <= pts.front().first) return clamp || x == pts.front().first ? pts.front().second : 0;
  if (x >= pts.back().first) return clamp || x == pts.back().first ? pts.back().second : 0;
  size_t i = 1;
  while (x > pts[i].first) ++i;
  const double x0 = std::log(pts[i - 1].first), x1 = std::log(pts[i].first);
  const double t = x1 > x0 ? (std::log(x) - x0) / (x1 - x0) : 1.0;
  if (log_y) {
    const double y0 = std::log(pts[i - 1].second), y1 = std::log(pts[i].second);
    return std::exp(y0 + t * (y1 - y0));
  }
  return pts[i - 1].second + t * (pts[i].second - pts[i - 1].second);
}

// A collective's time at `bytes` from its measured points ([[bytes, us]...]):
// log-log between points, the last point's bandwidth above them; 0 below
// the smallest (the alpha-beta fit answers there) or without points. One
// straight alpha-beta line cannot follow a machine whose bandwidth falls
// when the buffers leave the caches; the points can.
double interpolate_points(const nlohmann::json& fit, double bytes) {
  if (!fit.contains("points") || !fit["points"].is_array() || fit["points"].empty()) return 0;
  std::vector<std::pair<double, double>> pts;
  for (const auto& p : fit["points"]) {
    if (p.is_array() && p.size() == 2) pts.push_back({p[0].get<double>(), p[1].get<double>()});
  }
  if (pts.empty()) return 0;
  const auto last = *std::max_element(pts.begin(), pts.end());
  if (bytes > last.first) return last.second * 1e-6 * bytes / last.first;
  return interpolate_log_x(pts, bytes, /*log_y=*/true, /*clamp=*/false) * 1e-6;
}

// The measured attention rate at sequence length T (log-linear between the
// measured lengths, clamped at the ends) from the points of the run's dtype,
// or of any dtype where the profile has none of it (a CPU without bf16
// tiles runs a bf16 model's attention in fp32); 0 when the profile has none.
double measured_attention_gflops(const HwProfile& hw, const std::string& dtype, int64_t T) {
  std::vector<std::pair<double, double>> same, any;
  for (const auto& a : hw.attention) {
    any.push_back({static_cast<double>(a.seq), a.gflops});
    if (a.dtype == dtype) same.push_back(any.back());
  }
  return interpolate_log_x(same.empty() ? any : same, static_cast<double>(T), /*log_y=*/false,
                           /*clamp=*/true);
}

// Flash-style attention: (sequence, head) problems of T queries x T keys.
StepPart price_attention(const HwProfile& hw, const std::string& dtype, const AttentionWork& w,
                         const std::string& name) {
  const double peak = peak_or_throw(hw, dtype);
  const double T = static_cast<double>(w.T);
  if (const double measured = measured_attention_gflops(hw, dtype, w.T); measured > 0) {
    StepPart p{name, w.flops / (measured * 1e9), w.flops, "", "attention", dtype, 0};
    std::ostringstream d;
    d << w.problems << " x causal [" << w.T << " x " << w.T << " x " << w.head_dim << "] at "
      << fmt(measured, 1) << " GFLOP/s ("
      << (hw.origin == "published" ? "published kernel rate" : "measured kernel") << ")";
    p.detail = d.str();
    return p;
  }
  const double per_problem = 4.0 * static_cast<double>(w.head_dim) * T * (T + 1) / 2;
  double eff = curve_efficiency(hw, dtype, per_problem) * kAssumedAttentionRelative;
  if (hw.kind == "gpu" && hw.compute_units > 0) {
    const int64_t tiles = w.problems * ceil_div(w.T, 128);
    const int64_t waves = ceil_div(tiles, hw.compute_units);
    eff *= static_cast<double>(tiles) / static_cast<double>(waves * hw.compute_units);
  }
  StepPart p{name, w.flops / (peak * 1e9 * eff), w.flops, "", "attention", dtype, eff};
  std::ostringstream d;
  d << w.problems << " x causal [" << w.T << " x " << w.T << " x " << w.head_dim << "], eff "
    << fmt(eff * 100, 1) << "%";
  p.detail = d.str();
  return p;
}

double optimizer_bytes_per_param(const std::string& optimizer, const std::string& kind) {
  // AdamW reads p, g, m, v and writes p, m, v (28 B), plus the gradient
  // norm's reads: on a GPU two (8 B: its largest element, then the scaled
  // squares); on a CPU one (4 B), the squares summed in the same pass at the
  // last step's scale and its neighbours (optim/square_sum.hpp), redone only
  // on the rare step where the largest element moves by more than 2x.
  // Muon's momentum: read g, m, write m (12 B), and the same norm.
  const double norm = kind == "cpu" ? 4.0 : 8.0;
  return (optimizer == "muon" ? 12.0 : 28.0) + norm;
}

// The gradients zeroed before a step: those the backward adds to, every
// rank its whole array (only FSDP shards it). The experts' backward writes
// their gradients whole, so they are not zeroed.
double zeroed_gradients(const LocalParams& lp, const Layout& l) {
  return lp.replicated * (l.fsdp ? 1.0 / static_cast<double>(l.replicas()) : 1.0);
}

// A CPU BLAS packs each panel of an operand before it multiplies it, on the
// thread that then computes with it, so an operand that comes from DRAM adds
// its transfer to the GEMM's time instead of hiding under it. The measured
// grid repeats each call with its operands in cache; in a step each weight
// matrix is used once per pass and a layer's weights outgrow the caches
// (an expert's most of all: 128 rows to amortise them over). So the weight
// side is priced apart: read by the forward and the dgrad in the dtype they
// multiply, and the wgrad's fp32 output written after its lines are read
// (the old sum, or the write-allocate): 8 B per element.
double cold_weight_bytes(const model::GemmShape& s, const std::string& dtype) {
  if (s.name.ends_with(".wgrad")) return 8.0 * static_cast<double>(s.m * s.n);
  return bytes_of(dtype) * static_cast<double>(s.n * s.k);
}

// The bracket of x among sorted distinct values: lower and upper index and
// the weight of the upper one (log scale), x clamped to the ends.
struct Bracket {
  size_t lo = 0, hi = 0;
  double t = 0;
};
Bracket bracket(const std::vector<int64_t>& values, int64_t x) {
  Bracket b;
  if (x <= values.front()) return b;
  if (x >= values.back()) {
    b.lo = b.hi = values.size() - 1;
    return b;
  }
  while (values[b.hi] < x) ++b.hi;
  b.lo = values[b.hi] == x ? b.hi : b.hi - 1;
  if (b.lo != b.hi) {
    b.t = std::log(static_cast<double>(x) / static_cast<double>(values[b.lo])) /
          std::log(static_cast<double>(values[b.hi]) / static_cast<double>(values[b.lo]));
  }
  return b;
}

}  // namespace

double achievable_memory(const HwProfile& hw) {
  return hw.achievable.memory > 0 ? hw.achievable.memory : kDefaultAchievableMemory;
}

double achievable_link(const HwProfile& hw) {
  return hw.achievable.link > 0 ? hw.achievable.link : kDefaultAchievableLink;
}

double achievable_gemm(const HwProfile& hw, const std::string& dtype) {
  const auto it = hw.achievable.gemm.find(dtype);
  return it != hw.achievable.gemm.end() && it->second > 0 ? it->second : kDefaultAchievableGemm;
}

void apply_assumption(HwProfile& hw, const std::string& key_value) {
  const auto eq = key_value.find('=');
  const std::string key = key_value.substr(0, eq);
  double v = 0;
  bool ok = eq != std::string::npos;
  if (ok) {
    try {
      size_t used = 0;
      v = std::stod(key_value.substr(eq + 1), &used);
      ok = used == key_value.size() - eq - 1 && v > 0 && v <= 1;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok)
    throw InputError("--assume '" + key_value +
                     "': expected KEY=FRACTION with KEY memory, link, gemm or gemm.DTYPE and "
                     "FRACTION in (0, 1]");
  if (key == "memory") {
    hw.achievable.memory = v;
  } else if (key == "link") {
    hw.achievable.link = v;
  } else if (key == "gemm") {
    for (const auto& p : hw.peak) hw.achievable.gemm[p.dtype] = v;
    hw.gemm_efficiency.clear();  // the assumption replaces any curve
  } else if (key.rfind("gemm.", 0) == 0 && hw.peak_gflops(key.substr(5)) > 0) {
    hw.achievable.gemm[key.substr(5)] = v;
    hw.gemm_efficiency.erase(key.substr(5));
  } else {
    throw InputError("--assume '" + key_value +
                     "': expected KEY memory, link, gemm or gemm.DTYPE with a dtype of " + hw.name +
                     "'s peaks");
  }
}

double memory_gbs(const HwProfile& hw) {
  if (hw.origin == "published") return hw.memory_bandwidth_gbs * achievable_memory(hw);
  // Measured: the largest measured working set at the most threads.
  const MemoryLevel* best = nullptr;
  for (const auto& m : hw.memory_levels) {
    if (!best || m.working_set_bytes > best->working_set_bytes ||
        (m.working_set_bytes == best->working_set_bytes && m.threads > best->threads))
      best = &m;
  }
  return best ? best->gbs : hw.memory_bandwidth_gbs;
}

double grid_gflops(const HwProfile& hw, const std::string& dtype, int64_t m, int64_t n, int64_t k,
                   bool trans_a, bool trans_b) {
  std::vector<const GemmShapePoint*> pts;
  for (const auto& g : hw.gemm_grid)
    if (g.dtype == dtype && g.trans_a == trans_a && g.trans_b == trans_b && g.gflops > 0)
      pts.push_back(&g);
  if (pts.empty()) {
    for (const auto& g : hw.gemm_grid)
      if (g.dtype == dtype && g.gflops > 0) pts.push_back(&g);
  }
  if (pts.empty()) return 0;
  std::vector<int64_t> ms, ns, ks;
  std::map<std::array<int64_t, 3>, std::pair<double, int>> at;  // (m, n, k) -> sum, count
  for (const auto* g : pts) {
    ms.push_back(g->m);
    ns.push_back(g->n);
    ks.push_back(g->k);
    auto& cell = at[{g->m, g->n, g->k}];
    cell.first += g->gflops;
    cell.second += 1;
  }
  for (auto* v : {&ms, &ns, &ks}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const Bracket bm = bracket(ms, m), bn = bracket(ns, n), bk = bracket(ks, k);
  // The corners of the cell around (m, n, k); a corner the grid skipped (too
  // much work) drops out and the others are reweighted.
  double sum = 0, weight = 0;
  for (int c = 0; c < 8; ++c) {
    const bool um = c & 1, un = c & 2, uk = c & 4;
    const double w = (um ? bm.t : 1 - bm.t) * (un ? bn.t : 1 - bn.t) * (uk ? bk.t : 1 - bk.t);
    if (w <= 0) continue;
    const auto it =
        at.find({ms[um ? bm.hi : bm.lo], ns[un ? bn.hi : bn.lo], ks[uk ? bk.hi : bk.lo]});
    if (it == at.end()) continue;
    sum += w * it->second.first / it->second.second;
    weight += w;
  }
  if (weight > 0.25) return sum / weight;
  // Too few corners (a scattered set): the nearest point in log space.
  double best_d = 0, best = 0;
  for (const auto* g : pts) {
    const double d = std::pow(std::log(static_cast<double>(g->m) / m), 2) +
                     std::pow(std::log(static_cast<double>(g->n) / n), 2) +
                     std::pow(std::log(static_cast<double>(g->k) / k), 2);
    if (best == 0 || d < best_d) {
      best_d = d;
      best = g->gflops;
    }
  }
  return best;
}

double curve_efficiency(const HwProfile& hw, const std::string& dtype, double work) {
  const auto it = hw.gemm_efficiency.find(dtype);
  if (it == hw.gemm_efficiency.end() || it->second.empty()) return achievable_gemm(hw, dtype);
  std::vector<std::pair<double, double>> pts;
  for (const auto& p : it->second) pts.push_back({p.flops, p.efficiency});
  return interpolate_log_x(pts, work, /*log_y=*/false, /*clamp=*/true);
}

GemmPrice price_gemm(const HwProfile& hw, const std::string& dtype, int64_t m, int64_t n, int64_t k,
                     bool trans_a, bool trans_b) {
  const double peak = peak_or_throw(hw, dtype);
  GemmPrice g;
  g.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  for (const auto& s : hw.gemm_shapes) {
    if (s.dtype == dtype && s.m == m && s.n == n && s.k == k && s.trans_a == trans_a &&
        s.trans_b == trans_b && s.gflops > 0) {
      g.measured = true;
      g.efficiency = s.gflops / peak;
      g.curve = g.efficiency;
      g.seconds = g.flops / (s.gflops * 1e9);
      return g;
    }
  }
  if (const double gf = grid_gflops(hw, dtype, m, n, k, trans_a, trans_b); gf > 0) {
    g.surface = true;
    g.efficiency = gf / peak;
    g.curve = g.efficiency;
    g.seconds = g.flops / (gf * 1e9);
    return g;
  }
  g.curve = curve_efficiency(hw, dtype, g.flops);
  if (hw.kind == "gpu" && hw.compute_units > 0) {
    const int64_t tm = ceil_div(m, kGpuTileM), tn = ceil_div(n, kGpuTileN);
    g.tiles = tm * tn;
    g.tile = static_cast<double>(m) * static_cast<double>(n) /
             (static_cast<double>(tm * kGpuTileM) * static_cast<double>(tn * kGpuTileN));
    // Fewer tiles than units: libraries split K across units (split-K /
    // stream-K) in chunks of at least 256, so count the split tiles.
    int64_t work_tiles = g.tiles;
    if (g.tiles < hw.compute_units) {
      const int64_t split =
          std::max<int64_t>(1, std::min(hw.compute_units / g.tiles, k / kMinSplitK));
      work_tiles = g.tiles * split;
    }
    g.waves = ceil_div(work_tiles, hw.compute_units);
    g.wave = static_cast<double>(work_tiles) / static_cast<double>(g.waves * hw.compute_units);
  }
  const double db = bytes_of(dtype);
  const double bytes = (static_cast<double>(m) * static_cast<double>(k) +
                        static_cast<double>(k) * static_cast<double>(n) +
                        static_cast<double>(m) * static_cast<double>(n)) *
                       db;
  g.roofline = std::min(1.0, g.flops / bytes * memory_gbs(hw) / peak);
  g.efficiency = std::min(g.curve * g.tile * g.wave, g.roofline);
  g.seconds = g.flops / (peak * 1e9 * g.efficiency);
  return g;
}

namespace {

// The profile's measured fit of `op` on `ranks` ranks of one node (the
// fastest algorithm unless `algo` names one): seconds, or -1 without one.
double measured_collective(const HwProfile& hw, const std::string& op, int64_t ranks, double bytes,
                           const std::string& algo, std::string& how) {
  const std::string key = std::to_string(ranks);
  if (!hw.comm.contains("ranks") || !hw.comm["ranks"].contains(key) ||
      !hw.comm["ranks"][key].contains(op))
    return -1;
  double best = -1;
  for (const auto& [name, fit] : hw.comm["ranks"][key][op].items()) {
    if (!algo.empty() && name != algo) continue;
    const double bw = fit.value("bandwidth_gbs", 0.0);
    if (!(bw > 0)) continue;
    double t = fit.value("alpha_us", 0.0) * 1e-6 + bytes / (bw * 1e9);
    if (const double measured = interpolate_points(fit, bytes); measured > 0) t = measured;
    if (best < 0 || t < best) {
      best = t;
      how = "measured " + name + " (" + key + " ranks)";
    }
  }
  return best;
}

}  // namespace

CommPrice price_collective(const HwProfile& hw, const std::string& op, int64_t ranks,
                           int64_t ranks_per_node, double bytes, const std::string& algo) {
  CommPrice c;
  if (ranks < 2) return c;
  const int64_t G = std::max<int64_t>(1, std::min(ranks, ranks_per_node));
  const int64_t N = ceil_div(ranks, G);
  const std::string key = std::to_string(ranks);
  // Measured fits (anvil bench comm, on one node) win for single-node groups.
  if (N == 1) {
    if (const double t = measured_collective(hw, op, ranks, bytes, algo, c.how); t >= 0) {
      c.seconds = t;
      return c;
    }
    // A message each way between two ranks moves what a 2-rank all-gather
    // of twice the bytes does: the measured fit prices it where the profile
    // has no link (a CPU's ranks).
    if (op == "sendrecv" && !(hw.interconnect.intra_node_gbs > 0)) {
      if (const double t = measured_collective(hw, "allgather", 2, 2 * bytes, "", c.how); t >= 0) {
        c.how += ", as an exchange";
        c.seconds = t;
        return c;
      }
    }
  }
  if (!algo.empty() && algo != "ring")
    throw InputError("hardware profile " + hw.name + ": no measured " + op + " fit for algo " +
                     algo + " on " + key + " ranks (run anvil bench comm --profile)");
  if (!(op == "allreduce" || op == "reduce_scatter" || op == "allgather" || op == "alltoall" ||
        op == "broadcast" || op == "sendrecv"))
    throw InputError("collective '" + op +
                     "': expected allreduce, reduce_scatter, allgather, broadcast, alltoall or "
                     "sendrecv");
  // From the links: ring inside a node, rails across nodes (one NIC per
  // device). Inside the node a measured fit for G ranks replaces the ring.
  std::string intra_how;
  const double intra_measured =
      G > 1 && N > 1 ? measured_collective(hw, op, G, bytes, "", intra_how) : -1;
  const double intra = hw.interconnect.intra_node_gbs * achievable_link(hw) * 1e9;
  const double nics = std::max(1, hw.interconnect.nics_per_node);
  // Each device's own rail; ranks that share a node's links (a CPU's ranks)
  // share their bandwidth.
  const double inter = hw.interconnect.nic_gbps / 8.0 * nics /
                       static_cast<double>(std::max<int64_t>(G, hw.interconnect.devices_per_node)) *
                       achievable_link(hw) * 1e9;
  if ((G > 1 && intra_measured < 0 && !(intra > 0)) || (N > 1 && !(inter > 0)))
    throw InputError("hardware profile " + hw.name + ": no interconnect bandwidth and no " +
                     "measured " + op + " fit for " + key + " ranks" +
                     (N > 1 ? " (--link-gbps gives the inter-node link)" : ""));
  const double g = static_cast<double>(G), n = static_cast<double>(N);
  // One ring pass (reduce-scatter or all-gather): (G-1)/G of the data inside
  // the node, then (N-1)/N of each device's 1/G share across its rail.
  auto intra_pass = [&](double s) {
    return G > 1 ? (g - 1) / g * s / intra + (g - 1) * kIntraNodeAlphaUs * 1e-6 : 0.0;
  };
  auto inter_pass = [&](double s) {
    return N > 1 ? (n - 1) / n * (s / g) / inter + (n - 1) * kInterNodeAlphaUs * 1e-6 : 0.0;
  };
  const double passes =
      op == "allreduce" || op == "broadcast" ? 2 : 1;  // broadcast: scatter + all-gather
  if (op == "sendrecv") {
    // One point-to-point message: over a link inside the node, else over the
    // device's own rail.
    c.seconds =
        N > 1 ? bytes / inter + kInterNodeAlphaUs * 1e-6 : bytes / intra + kIntraNodeAlphaUs * 1e-6;
  } else if (op == "alltoall") {
    const double r = static_cast<double>(ranks);
    const double t_intra =
        G > 1 ? (intra_measured >= 0 ? intra_measured : bytes * (g - 1) / r / intra) : 0;
    const double t_inter = N > 1 ? bytes * (r - g) / r / inter : 0;
    c.seconds = std::max(t_intra, t_inter) + (r - 1) * kIntraNodeAlphaUs * 1e-6;
  } else if (intra_measured >= 0) {
    c.seconds = intra_measured + passes * inter_pass(bytes);
  } else {
    c.seconds = passes * (intra_pass(bytes) + inter_pass(bytes));
  }
  c.how = N > 1 ? "links: " + (intra_measured >= 0 ? intra_how + " in node" : "ring in node") +
                      " + rails (" + std::to_string(N) + " nodes)"
                : "links: ring in node";
  return c;
}

double decode_seconds_per_step(const model::ModelConfig& c, const HwProfile& hw,
                               const std::string& dtype, int64_t context, int64_t batch) {
  const model::ParamCount n = model::count_parameters(c);
  const double db = bytes_of(dtype);  // fp8: bf16 weights and cache
  double experts_total = 0;
  for (const auto& comp : n.components)
    if (comp.component == "experts") experts_total += static_cast<double>(comp.total);
  const double E = static_cast<double>(c.n_experts), k = static_cast<double>(c.top_k);
  const double B = static_cast<double>(std::max<int64_t>(1, batch));
  const double experts_active = E > 0 ? experts_total * k / E : 0;
  const double dense = static_cast<double>(n.non_embedding_active) - experts_active;
  const double touched = E > 0 ? experts_total * (1 - std::pow(1 - k / E, B)) : 0;
  const double head = static_cast<double>(c.vocab_size * c.d_model);
  const double kv = 2.0 * static_cast<double>(c.n_layers * c.n_kv_heads * c.head_dim) *
                    static_cast<double>(context) * db * B;
  const double read_s = ((dense + touched + head) * db + kv) / (memory_gbs(hw) * 1e9);
  const double flops = B * (2.0 * (static_cast<double>(n.non_embedding_active) + head) +
                            4.0 * static_cast<double>(c.n_layers * c.n_heads * c.head_dim) *
                                static_cast<double>(context));
  const std::string wide = dtype == "fp8" ? "bf16" : dtype;
  const double rate = peak_or_throw(hw, wide) * 1e9 * curve_efficiency(hw, wide, 1e12);
  return std::max(read_s, flops / rate);
}

int cpu_threads(const HwProfile& hw) {
  int threads = 0;
  for (const auto& p : hw.peak) threads = std::max(threads, p.threads);
  if (threads == 0) threads = static_cast<int>(std::max<int64_t>(1, hw.compute_units));
  return threads;
}

double cpu_rank_share(const HwProfile& hw, const Layout& l) {
  if (hw.kind != "cpu") return 1.0;
  const double threads = cpu_threads(hw);
  const double per_rank =
      l.threads_per_rank > 0
          ? static_cast<double>(l.threads_per_rank)
          : threads / static_cast<double>(std::max<int64_t>(1, l.devices_per_node));
  return std::min(1.0, per_rank / threads);
}

HwProfile cpu_rank_view(const HwProfile& hw, double share) {
  if (share >= 1.0) return hw;
  HwProfile v = hw;
  for (auto& p : v.peak) p.gflops *= share;
  for (auto& g : v.gemm_shapes) g.gflops *= share;
  for (auto& g : v.gemm_grid) g.gflops *= share;
  for (auto& a : v.attention) a.gflops *= share;
  for (auto& m : v.memory_levels) m.gbs *= share;
  v.memory_bandwidth_gbs *= share;
  return v;
}

// optim/muon.cpp's passes: the norm, scaling (or transposing) in and copying
// (or transposing) out, 20 B an element; then per iteration Y's copy of X (8
// B an element; 10 with bf16 inputs, rounded in the same pass) and, per
// element of the Gram matrices, in fp32 A's and B's mirrors (a half read and
// a half written, 4 B each) and A's copy (8 B), with bf16 inputs A's lower
// half read and rounded, mirrored and copied whole (8 B) and B's rounded and
// mirrored (4 B).
double newton_schulz_bytes(int64_t r, int64_t c, bool bf16) {
  const double x = static_cast<double>(r) * static_cast<double>(c);
  const double gram = static_cast<double>(r) * static_cast<double>(r);
  return 20.0 * x + 5.0 * (bf16 ? 10.0 * x + 12.0 * gram : 8.0 * x + 16.0 * gram);
}

namespace {

// The compute of a step, part by part (GEMMs, attention, element-wise work,
// MoE dispatch, recompute, the pipeline's stage share and bubble).
void predict_compute(const model::ModelConfig& c, const HwProfile& hw, const Layout& l,
                     const std::string& wide, Prediction& p) {
  const double micro = static_cast<double>(l.accumulation());
  // Compute of one micro-batch, by GEMM name (layers and experts folded in).
  double forward_s = 0;
  // fp8 training (Transformer Engine) runs the layers' linear GEMMs in fp8;
  // the classifier is not a Transformer Engine module in Megatron-Core and
  // stays in bf16. Each fp8 GEMM's activation input (forward) and output
  // gradient (backward) is cast to fp8 in both layouts (row- and column-wise,
  // the wgrad GEMM reads the transpose): read 2 B, write 2 x 1 B per element.
  double fp8_cast_bytes = 0;
  // A CPU's bf16 GEMMs take bf16 inputs, and the activations are fp32: each
  // linear layer converts its input for the forward, and its output gradient
  // and its input again for the backward (kernels::linear_forward and
  // linear_backward: read 4 B, write 2 B per element). The weights' bf16
  // copies are written by the optimizer step (predict_optimizer).
  double bf16_convert_bytes = 0;
  const double gbs = memory_gbs(hw);
  for (const auto& g : step_gemms(c, l, true)) {
    const bool classifier = g.shape.name.rfind("lm_head", 0) == 0;
    const std::string dtype = l.dtype == "fp8" && classifier ? wide : l.dtype;
    const GemmPrice price =
        price_gemm(hw, dtype, g.shape.m, g.shape.n, g.shape.k, g.shape.trans_a, g.shape.trans_b);
    const double count = static_cast<double>(g.count) * micro;
    if (dtype == "fp8" && !g.shape.name.ends_with(".wgrad"))
      fp8_cast_bytes += 4.0 * static_cast<double>(g.shape.m * g.shape.k) * count;
    if (dtype == "bf16" && hw.kind == "cpu" && g.shape.name.ends_with(".fwd"))
      bf16_convert_bytes +=
          6.0 * static_cast<double>(g.shape.m * (2 * g.shape.k + g.shape.n)) * count;
    const double weights_s =
        hw.kind == "cpu" ? cold_weight_bytes(g.shape, dtype) * count / (gbs * 1e9) : 0.0;
    StepPart part{g.shape.name,
                  price.seconds * count + weights_s,
                  price.flops * count,
                  "",
                  "gemm",
                  dtype,
                  price.efficiency,
                  weights_s};
    std::ostringstream d;
    d << g.count << " x [" << g.shape.m << " x " << g.shape.n << " x " << g.shape.k << "], eff "
      << fmt(price.efficiency * 100, 1) << "%"
      << (price.measured  ? " (measured shape)"
          : price.surface ? " (measured grid)"
                          : "");
    if (hw.kind == "gpu")
      d << " (tile " << fmt(price.tile, 2) << ", wave " << fmt(price.wave, 2) << ")";
    if (dtype != l.dtype) d << ", " << dtype;
    if (weights_s > 0) d << ", + " << fmt(weights_s * 1e3, 1) << " ms weights from DRAM";
    part.detail = d.str();
    if (g.shape.name.ends_with(".fwd") && !classifier) forward_s += part.seconds;
    p.compute.push_back(part);
  }
  StepPart attention = price_attention(hw, wide, step_attention(c, l, true), "attention");
  attention.seconds *= micro;
  attention.flops *= micro;
  attention.kind = "attention";
  forward_s += attention.seconds / 3;
  p.compute.push_back(attention);
  // Element-wise work (norms, activations, residuals, softmax of the
  // classifier chunks): each saved activation is written in forward, read in
  // backward and its gradient written and read: ~6 passes over them.
  Layout no_recompute = l;
  no_recompute.recompute = false;
  no_recompute.pp = 1;  // every layer, one micro-batch: the stage's share comes below
  const MemoryPerRank m0 = memory_per_rank(c, no_recompute);
  const double elementwise_bytes = 6.0 * m0.activations_no_recompute * micro;
  p.compute.push_back({"element-wise", elementwise_bytes / (gbs * 1e9), 0,
                       fmt(elementwise_bytes / 1e9, 2) + " GB at " + fmt(gbs, 1) + " GB/s",
                       "memory", "", 0});
  // Zeroing the gradients before the step (4 B each), of the forward and
  // backward's time as the trainer counts it. Once a step: Megatron-Core
  // accumulates the micro-batches into one buffer; anvil's trainer clears
  // again before each further micro-batch and sums them apart, a copy or
  // add per micro-batch that is not priced either.
  const double zero_bytes = 4.0 * zeroed_gradients(local_params(c, no_recompute), l);
  p.compute.push_back(
      {"gradient zeroing", zero_bytes / (gbs * 1e9), 0,
       fmt(zero_bytes / 1e9, 2) + " GB at " + fmt(gbs, 1) + " GB/s" +
           (c.n_experts > 0 ? " (the experts' gradients are written, not zeroed)" : ""),
       "memory", "", 0});
  if (bf16_convert_bytes > 0)
    p.compute.push_back({"bf16 input conversions", bf16_convert_bytes / (gbs * 1e9), 0,
                         fmt(bf16_convert_bytes / 1e9, 2) + " GB at " + fmt(gbs, 1) + " GB/s",
                         "memory", "", 0});
  if (fp8_cast_bytes > 0)
    p.compute.push_back({"fp8 casts", fp8_cast_bytes / (gbs * 1e9), 0,
                         fmt(fp8_cast_bytes / 1e9, 2) + " GB at " + fmt(gbs, 1) + " GB/s",
                         "memory", "", 0});
  if (c.n_experts > 0) {
    // Token dispatch and combine on the rank: gather each routed token's row
    // into expert order and scatter-add the weighted outputs back (a read and
    // a write of top_k x d_model per token each), forward and twice in
    // backward; skipped tokens move nothing.
    const double skip = l.expert_shares.empty() ? 0.0 : l.expert_shares.back();
    const double rows = static_cast<double>(l.micro_batch * l.seq / l.cp * c.top_k) * (1 - skip);
    const double bytes = 3.0 * 4.0 * rows * static_cast<double>(c.d_model) * bytes_of(l.dtype) *
                         static_cast<double>(c.n_layers) * micro;
    p.compute.push_back({"moe dispatch + combine", bytes / (gbs * 1e9), 0,
                         fmt(bytes / 1e9, 2) + " GB at " + fmt(gbs, 1) + " GB/s", "memory", "",
                         0});
  }
  if (l.recompute) {
    const double share = recompute_share(c, l);
    p.compute.push_back({"recompute (forward again)", forward_s * share, 0,
                         share < 1 ? fmt(share * 100, 1) + "% of the layers"
                                   : std::string("every layer"),
                         "recompute", "", 0});
  }
  if (l.pp > 1) {
    // The slowest stage sets the pace: it runs the largest stage's share of
    // the layers (1/pp when pp divides them; the classifier's share counted
    // alike); 1F1B idles (pp - 1) / vp micro-batch slots of a step.
    const double stage = static_cast<double>(stage_layers(c, l)) / static_cast<double>(c.n_layers);
    double stage_s = 0;
    for (auto& part : p.compute) {
      part.seconds *= stage;
      part.flops *= stage;
      stage_s += part.seconds;
    }
    const double bubble = static_cast<double>(l.pp - 1) / static_cast<double>(l.vp) / micro;
    p.compute.push_back({"pipeline bubble", stage_s * bubble, 0,
                         fmt(bubble * 100, 1) + "% of the stage's compute: (pp - 1) / (vp x " +
                             std::to_string(l.accumulation()) + " micro-batches)",
                         "bubble", "", 0});
  }
  for (const auto& part : p.compute) p.compute_s += part.seconds;
}

// The rate of streams that update their arrays in place (the optimizer step,
// the gradient norm's reads, zeroing). A CPU's measured bandwidth is
// STREAM's triad, whose 12 counted bytes per element move 16: the
// destination line is read before it is written (write-allocate). An update
// in place reads and writes the same lines, so every byte it counts is one
// it moves: 4/3 of the triad's counted rate. GPUs and published figures
// count what moves already.
double in_place_gbs(const HwProfile& hw) {
  const bool triad = hw.kind == "cpu" && hw.origin != "published";
  return memory_gbs(hw) * (triad ? 4.0 / 3.0 : 1.0);
}

// Streaming over the local parameters (a 1/(dp x cp) share with ZeRO-1), plus
// Muon's Newton-Schulz (GEMMs and element-wise passes) on its share of the
// matrices.
double predict_optimizer(const model::ModelConfig& c, const HwProfile& hw, const Layout& l) {
  Prediction p;
  const LocalParams lp = local_params(c, l);
  const double owned = l.zero1 || l.fsdp ? 1.0 / static_cast<double>(l.replicas()) : 1.0;
  const double stream = lp.total() * owned * optimizer_bytes_per_param(l.optimizer, hw.kind) +
                        (l.dtype != "f32" ? lp.total() * 6.0 : 0.0);
  p.optimizer_s = stream / (in_place_gbs(hw) * 1e9);
  if (l.optimizer == "muon") {
    Layout balanced = l;  // Newton-Schulz runs on every matrix, whatever its load
    balanced.expert_shares.clear();
    const std::string dtype = l.muon_bf16 ? "bf16" : "f32";
    for (const auto& g : step_gemms(c, balanced, false)) {
      if (g.shape.name == "lm_head.fwd") continue;
      const int64_t a = std::min(g.shape.n, g.shape.k), b = std::max(g.shape.n, g.shape.k);
      const GemmPrice xxt = price_gemm(hw, dtype, a, a, b);
      const GemmPrice aa = price_gemm(hw, dtype, a, a, a);
      // X X^T and A A below the diagonal only (optim::symmetric_gram), B X in full.
      const double gram = optim::gram_flop_share(a);
      const double ns_s = 5.0 * ((1 + gram) * xxt.seconds + gram * aa.seconds);
      p.optimizer_s += (ns_s + newton_schulz_bytes(a, b, l.muon_bf16) / (in_place_gbs(hw) * 1e9)) *
                       static_cast<double>(g.count) * owned;
    }
  }

  return p.optimizer_s;
}

void predict_comm(const model::ModelConfig& c, const HwProfile& hw, const PlanOptions& o,
                  Prediction& p) {
  const Layout& l = o.layout;
  const double micro = static_cast<double>(l.accumulation());
  // Communication, and what of it the backward pass hides.
  // Gradients are final only in the last micro-batch's backward, so that is
  // what hides them; FSDP's per-micro-batch gathers hide under all compute.
  double overlappable = 0, exposed = 0;
  const double window = l.fsdp ? p.compute_s : p.compute_s * 2.0 / 3.0 / micro;
  for (const auto& op : comm_per_step(c, l)) {
    const CommPrice price = price_collective(hw, op.op, op.ranks, op.ranks_per_node, op.bytes);
    const double t = price.seconds * static_cast<double>(op.calls);
    p.comm.push_back({op.op + " " + op.group, t, 0,
                      std::to_string(op.calls) + " x " + fmt(op.bytes / 1e6, 1) + " MB over " +
                          std::to_string(op.ranks) + " ranks (" + op.what + "; " + price.how +
                          ")",
                      "comm", "", 0});
    p.comm_s += t;
    if (op.overlappable && o.overlap) {
      overlappable += t;
    } else {
      exposed += t;
    }
  }
  if (overlappable > 0) {
    // Bucketed per layer: the last bucket is always exposed.
    const double L = static_cast<double>(c.n_layers);
    exposed += std::max(overlappable / L, overlappable - window * (L - 1) / L);
  }
  p.comm_exposed_s = exposed;
}

void predict_checkpoint_and_goodput(const model::ModelConfig& c, const HwProfile& hw,
                                    const PlanOptions& o, Prediction& p) {
  const Layout& l = o.layout;
  // Checkpoint: fp32 weights + optimizer state of the whole model.
  const model::ParamCount n = model::count_parameters(c);
  const double state = l.optimizer == "muon" ? 6.0 : 8.0;  // Muon: momentum on most of it
  p.ckpt_bytes = static_cast<double>(n.total()) * (4.0 + state);
  p.ckpt_save_s = p.ckpt_bytes / (o.ckpt_gbs_per_node * 1e9 * static_cast<double>(l.nodes));
  if (o.mttf_hours > 0) {
    // What fails is a device: a GPU each rank, a CPU each node.
    const double world = static_cast<double>(hw.kind == "cpu" ? l.nodes : l.world());
    p.failures_per_day = world * 24.0 / o.mttf_hours;
    p.system_mttf_s = o.mttf_hours * 3600.0 / world;
    p.young_daly_s = std::sqrt(2.0 * p.ckpt_save_s * p.system_mttf_s);
    p.ckpt_interval_s = o.ckpt_interval_s > 0 ? o.ckpt_interval_s : p.young_daly_s;
    // First order (Daly): time lost to writing checkpoints, and per failure
    // half an interval of recomputation plus the restart.
    const double lost =
        p.ckpt_save_s / p.ckpt_interval_s + (p.ckpt_interval_s / 2 + o.restart_s) / p.system_mttf_s;
    p.goodput = std::clamp(1.0 - lost, 0.0, 1.0);
  }
}

void add_assumptions(const model::ModelConfig& c, const HwProfile& hw, const HwProfile& whole_hw,
                     double share, Prediction& p) {
  const Layout& l = p.layout;
  if (hw.gemm_efficiency.find(l.dtype) == hw.gemm_efficiency.end() && hw.gemm_grid.empty())
    p.assumptions.push_back("no measured " + l.dtype + " GEMM curve: plateau " +
                            fmt(achievable_gemm(hw, l.dtype), 2) + " of peak");
  if (hw.origin == "published")
    p.assumptions.push_back("memory at " + fmt(achievable_memory(hw), 2) + " of the datasheet " +
                            fmt(hw.memory_bandwidth_gbs, 0) + " GB/s");
  if (hw.attention.empty())
    p.assumptions.push_back("attention at " + fmt(kAssumedAttentionRelative, 2) +
                            " of the GEMM efficiency at its per-head work");
  if (c.n_experts > 0) {
    if (l.expert_shares.empty()) {
      p.assumptions.push_back("balanced routing (tokens x top_k / n_experts per expert)");
    } else {
      p.assumptions.push_back("routing as measured: skip " + fmt(l.expert_shares.back() * 100, 1) +
                              "%, each expert's GEMMs at its own rows" +
                              (l.ep > 1 ? " on the busiest rank" : ""));
    }
  }
  if (share < 1.0)
    p.assumptions.push_back("each rank runs at " + fmt(share, 3) + " of the CPU's measured " +
                            std::to_string(cpu_threads(whole_hw)) +
                            "-thread compute and memory rates");
  if (l.pp > 1)
    p.assumptions.push_back(
        stage_layers(c, l) * l.pp == c.n_layers
            ? "pipeline stages balanced (layers and classifier split evenly), 1F1B"
            : "pipeline stages uneven: priced at the largest, " +
                  std::to_string(stage_layers(c, l)) + " of " + std::to_string(c.n_layers) +
                  " layers (the classifier's share alike), 1F1B");
  if (l.tp > 1)
    p.assumptions.push_back("tensor-parallel collectives exposed (not overlapped with GEMMs)");
  if (l.dtype == "fp8")
    p.assumptions.push_back(
        "fp8 GEMMs at peak[fp8] x achievable; attention, memory and "
        "collectives in bf16; MFU against peak[bf16]");
  if (l.world() > 1)
    p.assumptions.push_back("links at " + fmt(achievable_link(hw), 2) +
                            " of their per-direction bandwidth where no fit was measured");
}

}  // namespace

namespace {

std::string source_of(const HwProfile& hw, const std::string& field) {
  for (const auto& s : hw.sources)
    if (s.field == field) return s.source;
  return "";
}

// Where a profile's rates come from, for the terms' sources.
std::string profile_origin(const HwProfile& hw) {
  return hw.origin == "published" ? "published profile " + hw.name
                                  : "profile " + hw.name + " measured on " + hw.device + " (" +
                                        hw.created + ")";
}

std::string memory_source(const HwProfile& hw) {
  if (hw.origin != "published")
    return profile_origin(hw) + ": the largest measured working set (anvil bench membw)";
  const std::string cited = source_of(hw, "achievable.memory");
  return "datasheet " + fmt(hw.memory_bandwidth_gbs, 0) + " GB/s x " +
         fmt(achievable_memory(hw), 3) +
         (cited.empty() ? " (default fraction: no public measurement)" : ": " + cited);
}

// The step time split into the model's terms: every second of step_s lands
// in exactly one of them.
std::vector<Term> model_terms(const model::ModelConfig& c, const HwProfile& hw, const Layout& l,
                              const Prediction& p) {
  std::vector<Term> terms;
  // GEMMs: at the plateau of their dtype, and what their sizes lose against
  // it. The plateau is the achievable fraction on a published profile and
  // the best efficiency any GEMM of the step reaches on a measured one.
  std::map<std::string, double> plateau;
  for (const auto& part : p.compute)
    if (part.kind == "gemm") plateau[part.dtype] = std::max(plateau[part.dtype], part.efficiency);
  if (hw.origin == "published")
    for (auto& [dtype, e] : plateau) e = std::max(e, achievable_gemm(hw, dtype));
  double gemm_s = 0, ideal_s = 0, flops = 0, weights_s = 0;
  for (const auto& part : p.compute) {
    if (part.kind != "gemm") continue;
    gemm_s += part.seconds - part.weights_s;
    weights_s += part.weights_s;
    flops += part.flops;
    ideal_s += part.flops / (peak_or_throw(hw, part.dtype) * 1e9 * plateau[part.dtype]);
  }
  std::string at, cited;
  for (const auto& [dtype, e] : plateau) {
    at += (at.empty() ? "" : ", ") + dtype + " " + fmt(peak_or_throw(hw, dtype) / 1e3, 1) +
          " TFLOP/s x " + fmt(e, 3);
    const std::string src = source_of(hw, "achievable.gemm[" + dtype + "]");
    if (hw.origin == "published")
      cited += (cited.empty() ? "" : "; ") + dtype + ": " +
               (src.empty() ? "default fraction " + fmt(kDefaultAchievableGemm, 2) +
                                  " (no public measurement)"
                            : src);
  }
  const std::string gemm_source =
      hw.origin == "published" ? "datasheet peak x achievable fraction; " + cited
                               : profile_origin(hw) + ": its best GEMM of this step";
  terms.push_back({"GEMMs at the plateau", ideal_s,
                   fmt(flops / 1e12, 2) + " TFLOP at peak x plateau (" + at + ")" +
                       (l.dtype == "fp8" ? "; the classifier in bf16" : ""),
                   gemm_source});
  terms.push_back(
      {"small-GEMM efficiency", gemm_s - ideal_s,
       hw.kind == "gpu"
           ? "each GEMM below the plateau: output tiles of 256 x 128, waves over " +
                 std::to_string(hw.compute_units) + " " + hw.compute_unit_name +
                 "s, memory roofline" + (hw.gemm_efficiency.empty() ? "" : ", work curve")
           : "each GEMM at its own measured shape or the measured grid at its size",
       hw.kind == "gpu" && hw.gemm_grid.empty() && hw.gemm_shapes.empty()
           ? "tile and wave quantization (docs/plan.md, as in Anthony et al. 2024); roofline from " +
                 memory_source(hw)
           : profile_origin(hw) + " (anvil bench gemm --preset grid / model)"});
  if (weights_s > 0)
    terms.push_back({"memory-bound: GEMM weights from DRAM", weights_s,
                     "each weight read by the forward and the dgrad (the GEMM's dtype), its "
                     "fp32 gradient read and written by the wgrad, at " +
                         fmt(memory_gbs(hw), 1) + " GB/s: a CPU packs it on the computing thread",
                     memory_source(hw)});
  for (const auto& part : p.compute) {
    if (part.kind == "attention") {
      std::string src;
      if (!hw.attention.empty())
        src = hw.origin == "published" ? source_of(hw, "attention")
                                       : profile_origin(hw) + " (anvil bench attention)";
      else
        src = "assumed: " + fmt(kAssumedAttentionRelative, 2) +
              " of the GEMM efficiency at its per-head work (no kernel rate in the profile)";
      terms.push_back({"attention (T " + std::to_string(l.seq) +
                           (l.cp > 1 ? ", cp " + std::to_string(l.cp) : std::string()) + ")",
                       part.seconds, part.detail, src});
    } else if (part.kind == "memory") {
      terms.push_back({"memory-bound: " + part.name, part.seconds, part.detail, memory_source(hw)});
    } else if (part.kind == "recompute") {
      terms.push_back({"recompute", part.seconds, "the forward once more: " + part.detail,
                       "the forward GEMMs and attention above"});
    } else if (part.kind == "bubble") {
      terms.push_back({"pipeline bubble", part.seconds, part.detail,
                       "1F1B with interleaved stages (Narayanan et al. 2021)"});
    }
  }
  const LocalParams lp = local_params(c, l);
  terms.push_back(
      {"memory-bound: optimizer step", p.optimizer_s,
       fmt(lp.total() / 1e6, 1) + " M local parameters x " +
           fmt(optimizer_bytes_per_param(l.optimizer, hw.kind), 0) + " B" +
           (l.zero1 || l.fsdp ? (l.cp > 1 ? " / (dp x cp)" : " / dp") : "") +
           (l.optimizer == "muon" ? std::string(" + Newton-Schulz GEMMs (") +
                                        (l.muon_bf16 ? "bf16" : "f32") + ") and passes"
                                  : std::string()) +
           " at " + fmt(in_place_gbs(hw), 1) + " GB/s" +
           (in_place_gbs(hw) > memory_gbs(hw) ? " (in place: 4/3 of triad's rate)" : ""),
       memory_source(hw)});
  std::string link_src = "measured collective fits of " + profile_origin(hw);
  if (!hw.comm.contains("ranks") || hw.comm["ranks"].empty()) {
    const std::string cited = source_of(hw, "achievable.link");
    link_src = "links at " + fmt(achievable_link(hw), 3) + " of their per-direction bandwidth" +
               (cited.empty() ? " (default fraction)" : ": " + cited);
  }
  terms.push_back({"exposed communication", p.comm_exposed_s,
                   "of " + fmt(p.comm_s, 4) + " s of collectives; gradients hidden under the " +
                       "last micro-batch's backward, bucketed per layer" +
                       (l.tp > 1 || l.cp > 1 || l.pp > 1 || l.ep > 1
                            ? "; tensor/context/pipeline/expert messages exposed"
                            : ""),
                   link_src});
  return terms;
}

}  // namespace

Prediction predict_step(const model::ModelConfig& c, const HwProfile& whole_hw,
                        const PlanOptions& o) {
  const Layout& l = o.layout;
  validate_layout(c, l);
  // On a CPU a rank is a share of the processor: it computes and streams
  // memory at that share of the whole-CPU rates the profile measured.
  const double share = cpu_rank_share(whole_hw, l);
  const HwProfile hw = cpu_rank_view(whole_hw, share);
  Prediction p;
  p.model = c.name;
  p.hw = hw.name;
  p.layout = l;
  peak_or_throw(hw, l.dtype);  // the GEMMs' peak must exist
  // fp8 runs its GEMMs in fp8; attention, MFU and everything else in bf16.
  const std::string wide = l.dtype == "fp8" ? "bf16" : l.dtype;
  const double peak = peak_or_throw(hw, wide);
  predict_compute(c, hw, l, wide, p);
  p.optimizer_s = predict_optimizer(c, hw, l);
  predict_comm(c, hw, o, p);
  p.step_s = p.compute_s + p.comm_exposed_s + p.optimizer_s;
  p.tokens_per_step = static_cast<double>(l.global_batch * l.seq);
  p.tokens_per_s = p.tokens_per_step / p.step_s;
  p.model_flops_per_token = model::flops_per_token(c, l.seq).training();
  p.mfu = p.model_flops_per_token * p.tokens_per_s / (peak * 1e9 * static_cast<double>(l.world()));
  p.memory = memory_per_rank(c, l);
  // A CPU's memory is its node's, shared by the ranks on it; a GPU's its own.
  p.memory_capacity =
      static_cast<double>(hw.memory_bytes) /
      (hw.kind == "cpu" ? static_cast<double>(std::max<int64_t>(1, l.devices_per_node)) : 1.0);
  predict_checkpoint_and_goodput(c, hw, o, p);
  p.decode_s_per_token = decode_seconds_per_step(c, hw, l.dtype, l.seq, 1);
  add_assumptions(c, hw, whole_hw, share, p);
  p.terms = model_terms(c, hw, l, p);
  return p;
}

std::string prediction_text(const Prediction& p) {
  std::ostringstream s;
  const Layout& l = p.layout;
  s << "# " << p.model << " on " << p.hw << ": " << l.nodes << " node(s) x " << l.devices_per_node
    << ", dp " << l.dp() << ", ep " << l.ep
    << (l.tp > 1 ? ", tp " + std::to_string(l.tp) : std::string())
    << (l.pp > 1 ? ", pp " + std::to_string(l.pp) +
                       (l.vp > 1 ? " (vp " + std::to_string(l.vp) + ")" : std::string())
                 : std::string())
    << (l.cp > 1 ? ", cp " + std::to_string(l.cp) : std::string()) << (l.zero1 ? ", ZeRO-1" : "")
    << (l.fsdp ? ", FSDP" : "") << ", global batch " << l.global_batch << " x " << l.seq
    << " (micro-batch " << l.micro_batch << ", " << l.accumulation() << " per step), " << l.dtype
    << ", " << l.optimizer << (l.recompute ? ", recompute" : "") << "\n";
  Table t({"part", "seconds", "share", "detail"});
  for (const auto& part : p.compute)
    t.add_row({part.name, fmt(part.seconds, 4), fmt(part.seconds / p.step_s * 100, 1) + "%",
               part.detail});
  for (const auto& part : p.comm)
    t.add_row({part.name, fmt(part.seconds, 4), "(full)", part.detail});
  t.add_row({"= compute", fmt(p.compute_s, 4), fmt(p.compute_s / p.step_s * 100, 1) + "%", ""});
  t.add_row({"= communication exposed", fmt(p.comm_exposed_s, 4),
             fmt(p.comm_exposed_s / p.step_s * 100, 1) + "%",
             "of " + fmt(p.comm_s, 4) + " s in total"});
  t.add_row(
      {"= optimizer", fmt(p.optimizer_s, 4), fmt(p.optimizer_s / p.step_s * 100, 1) + "%", ""});
  t.add_row({"= step", fmt(p.step_s, 4), "100%", ""});
  s << t.to_text();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  s << "tokens/s " << fmt(p.tokens_per_s, 1) << " (" << fmt(p.tokens_per_s / l.world(), 1)
    << " per device), MFU " << fmt(p.mfu * 100, 1) << "% (" << fmt(p.model_flops_per_token / 1e9, 3)
    << " GFLOP per token)\n";
  s << "memory per rank: weights " << fmt(p.memory.weights / gib, 2) << " GiB, gradients "
    << fmt(p.memory.gradients / gib, 2) << ", optimizer " << fmt(p.memory.optimizer / gib, 2)
    << ", activations " << fmt(p.memory.activations / gib, 2) << " (recompute "
    << fmt(p.memory.activations_recompute / gib, 2) << ", none "
    << fmt(p.memory.activations_no_recompute / gib, 2) << ") = " << fmt(p.memory.total() / gib, 2)
    << " GiB of " << fmt(p.memory_capacity / gib, 1)
    << (p.memory.total() > p.memory_capacity ? "  DOES NOT FIT" : "") << "\n";
  s << "checkpoint " << fmt(p.ckpt_bytes / 1e9, 2) << " GB, save " << fmt(p.ckpt_save_s, 1)
    << " s\n";
  if (p.system_mttf_s > 0) {
    s << "failures/day " << fmt(p.failures_per_day, 2) << " (system MTTF "
      << fmt(p.system_mttf_s / 3600, 2) << " h), Young/Daly interval "
      << fmt(p.young_daly_s / 60, 1) << " min, interval used " << fmt(p.ckpt_interval_s / 60, 1)
      << " min, goodput " << fmt(p.goodput * 100, 1) << "%\n";
  }
  s << "decode (batch 1, " << l.seq << " context): " << fmt(p.decode_s_per_token * 1e3, 3)
    << " ms/token\n";
  for (const auto& a : p.assumptions) s << "assumed: " << a << "\n";
  return s.str();
}

std::string explain_text(const Prediction& p) {
  std::ostringstream s;
  s << "# the step time of " << p.model << " on " << p.hw << " by model term (" << fmt(p.step_s, 4)
    << " s)\n";
  Table t({"term", "seconds", "share", "how"});
  std::vector<std::string> sources;
  double sum = 0;
  for (const auto& term : p.terms) {
    auto it = std::find(sources.begin(), sources.end(), term.source);
    if (it == sources.end()) it = sources.insert(sources.end(), term.source);
    const std::string ref = " [" + std::to_string(it - sources.begin() + 1) + "]";
    t.add_row({term.name, fmt(term.seconds, 4), fmt(term.seconds / p.step_s * 100, 1) + "%",
               term.how + ref});
    sum += term.seconds;
  }
  t.add_row({"= step", fmt(sum, 4), "100%", ""});
  s << t.to_text() << "sources:\n";
  for (size_t i = 0; i < sources.size(); ++i) s << "  [" << i + 1 << "] " << sources[i] << "\n";
  return s.str();
}

std::string prediction_json(const Prediction& p) {
  auto parts = [](const std::vector<StepPart>& v) {
    json a = json::array();
    for (const auto& x : v)
      a.push_back(
          {{"name", x.name}, {"seconds", x.seconds}, {"flops", x.flops}, {"detail", x.detail}});
    return a;
  };
  json terms = json::array();
  for (const auto& t : p.terms)
    terms.push_back(
        {{"name", t.name}, {"seconds", t.seconds}, {"how", t.how}, {"source", t.source}});
  const Layout& l = p.layout;
  json j = {{"model", p.model},
            {"hw", p.hw},
            {"layout",
             {{"nodes", l.nodes},
              {"gpus_per_node", l.devices_per_node},
              {"dp", l.dp()},
              {"world", l.world()},
              {"tp", l.tp},
              {"pp", l.pp},
              {"vp", l.vp},
              {"cp", l.cp},
              {"fsdp", l.fsdp},
              {"ep", l.ep},
              {"zero1", l.zero1},
              {"global_batch", l.global_batch},
              {"micro_batch", l.micro_batch},
              {"seq", l.seq},
              {"accumulation", l.accumulation()},
              {"dtype", l.dtype},
              {"optimizer", l.optimizer},
              {"recompute", l.recompute}}},
            {"compute", parts(p.compute)},
            {"terms", terms},
            {"comm", parts(p.comm)},
            {"compute_s", p.compute_s},
            {"comm_s", p.comm_s},
            {"comm_exposed_s", p.comm_exposed_s},
            {"optimizer_s", p.optimizer_s},
            {"step_s", p.step_s},
            {"tokens_per_step", p.tokens_per_step},
            {"tokens_per_s", p.tokens_per_s},
            {"model_flops_per_token", p.model_flops_per_token},
            {"mfu", p.mfu},
            {"memory_bytes",
             {{"weights", p.memory.weights},
              {"gradients", p.memory.gradients},
              {"optimizer", p.memory.optimizer},
              {"activations", p.memory.activations},
              {"activations_recompute", p.memory.activations_recompute},
              {"activations_no_recompute", p.memory.activations_no_recompute},
              {"total", p.memory.total()},
              {"capacity", p.memory_capacity},
              {"fits", p.memory.total() <= p.memory_capacity}}},
            {"checkpoint", {{"bytes", p.ckpt_bytes}, {"save_s", p.ckpt_save_s}}},
            {"decode_s_per_token", p.decode_s_per_token},
            {"assumptions", p.assumptions}};
  if (p.system_mttf_s > 0)
    j["reliability"] = {{"failures_per_day", p.failures_per_day},
                        {"system_mttf_s", p.system_mttf_s},
                        {"young_daly_interval_s", p.young_daly_s},
                        {"ckpt_interval_s", p.ckpt_interval_s},
                        {"goodput", p.goodput}};
  return j.dump(2) + "\n";
}

}  // namespace anvil::plan
