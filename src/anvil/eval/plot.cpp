#include "anvil/eval/plot.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"

namespace anvil::eval {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Series for one chart: named blocks of rows ("x y ..." lines).
struct Blocks {
  std::vector<std::string> names;
  std::vector<std::string> rows;
  std::string& block(const std::string& name) {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return rows[i];
    names.push_back(name);
    rows.emplace_back();
    return rows.back();
  }
  // gnuplot's data file: blocks separated by two blank lines (plot ... index i).
  std::string text() const {
    std::string s;
    for (const auto& r : rows) s += r + "\n\n";
    return s;
  }
};

std::string quote(const std::string& s) {  // a gnuplot single-quoted string
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

std::string row(std::initializer_list<double> values) {
  std::string s;
  char b[32];
  for (const double v : values) {
    std::snprintf(b, sizeof b, "%.9g ", v);
    s += b;
  }
  return s + "\n";
}

// Renders `body` (gnuplot commands after terminal and output are set; data
// files are named by their keys, relative to a scratch directory) into
// out_dir/png. Returns the PNG's path.
std::string render(const std::string& out_dir, const std::string& png, const std::string& body,
                   const std::map<std::string, std::string>& data) {
  char scratch[] = "/tmp/anvil-plot-XXXXXX";
  if (::mkdtemp(scratch) == nullptr) throw SystemError("plot: cannot create a scratch directory");
  const fs::path dir(scratch);
  const fs::path target = fs::absolute(fs::path(out_dir) / png);
  const fs::path tmp = target.parent_path() / ("." + png + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  try {
    for (const auto& [name, text] : data) std::ofstream(dir / name) << text;
    std::ofstream(dir / "plot.gp")
        << "set terminal pngcairo size 1100,620 enhanced font 'DejaVu Sans,11'\n"
        << "set output " << quote(tmp.string()) << "\n"
        << "set grid lc rgb '#dddddd'\nset key outside right top\n"
        << body;
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::chdir(scratch) != 0) ::_exit(126);
      ::execlp("gnuplot", "gnuplot", "plot.gp", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw SystemError(WIFEXITED(status) && WEXITSTATUS(status) == 127
                            ? "plot: gnuplot not found (scripts/install-deps.sh installs gnuplot-nox)"
                            : "plot: gnuplot failed on " + png);
    }
    fs::rename(tmp, target, ec);
    if (ec) throw SystemError(target.string() + ": cannot rename into place: " + ec.message());
  } catch (...) {
    fs::remove(tmp, ec);
    fs::remove_all(dir, ec);
    throw;
  }
  fs::remove_all(dir, ec);
  return target.string();
}

// "plot 'f' index 0 ... title 'a', '' index 1 ... title 'b'"
std::string plot_blocks(const std::string& file, const Blocks& b, const std::string& using_,
                        const std::string& style) {
  std::string s;
  for (size_t i = 0; i < b.names.size(); ++i) {
    s += (i == 0 ? "plot " + quote(file) : std::string(", ''")) + " index " + std::to_string(i) +
         " using " + using_ + " with " + style + " title " + quote(b.names[i]);
  }
  return s + "\n";
}

void make_dir(const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw SystemError("--out: " + out_dir + ": cannot create directory: " + ec.message());
}

}  // namespace

std::vector<std::string> plot_run(const std::string& run_dir, const std::string& out_dir) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream f(path);
  if (!f) throw InputError("--run: " + path + ": no such file (expected an anvil train --out directory)");
  Blocks loss, val, lr, speed, load, skip;
  double max_skip = 0;
  bool any_ratio = false;  // an expert without tokens at every step leaves none
  std::string line;
  int64_t n = 0;
  for (int64_t no = 1; std::getline(f, line); ++no) {
    if (line.empty()) continue;
    json m;
    try {
      m = json::parse(line);
      const double step = m.at("step").get<double>();
      const double tokens = m.value("tokens", step);
      const std::string phase = m.value("phase", std::string("train"));
      loss.block(phase) += row({tokens, m.at("loss").get<double>()});
      if (m.contains("val_loss")) val.block("validation") += row({tokens, m["val_loss"].get<double>()});
      lr.block("lr") += row({step, m.at("lr").get<double>()});
      speed.block("tokens/s") += row({step, m.value("tokens_per_s", 0.0), 100 * m.value("mfu", 0.0)});
      if (m.contains("router")) {
        for (const auto& l : m["router"]) {
          const std::string name = "layer " + l.at("layer").dump();
          const double mm = l.contains("max_over_min") && l["max_over_min"].is_number()
                                ? l["max_over_min"].get<double>()
                                : -1.0;
          // An expert without tokens has no ratio: a gap in the line.
          load.block(name) += mm > 0 ? row({step, mm}) : std::string("\n");
          any_ratio = any_ratio || mm > 0;
          skip.block(name) += row({step, 100 * l.value("skip_rate", 0.0)});
          max_skip = std::max(max_skip, 100 * l.value("skip_rate", 0.0));
        }
      }
    } catch (const json::exception& e) {
      throw InputError(path + ": line " + std::to_string(no) + ": " + e.what());
    }
    ++n;
  }
  if (n == 0) throw InputError("--run: " + path + ": no steps yet");
  make_dir(out_dir);
  const std::string title = "set title " + quote(fs::path(run_dir).filename().string()) + " noenhanced\n";
  std::vector<std::string> out;
  std::string loss_plot = title + "set xlabel 'tokens'\nset ylabel 'loss (nats/token)'\n" +
                          plot_blocks("loss.dat", loss, "1:2", "lines lw 1.5");
  if (!val.names.empty()) {
    loss_plot.pop_back();
    loss_plot += ", 'val.dat' using 1:2 with linespoints pt 7 ps 1.2 lw 2 lc rgb 'black' title 'validation'\n";
  }
  out.push_back(render(out_dir, "loss.png", loss_plot,
                       {{"loss.dat", loss.text()}, {"val.dat", val.text()}}));
  out.push_back(render(out_dir, "lr.png",
                       title + "set xlabel 'step'\nset ylabel 'learning rate'\nset format y '%.1e'\n" +
                           plot_blocks("lr.dat", lr, "1:2", "lines lw 2"),
                       {{"lr.dat", lr.text()}}));
  out.push_back(render(
      out_dir, "throughput.png",
      title + "set xlabel 'step'\nset ylabel 'tokens/s'\nset y2label 'MFU (%)'\nset ytics nomirror\n"
              "set y2tics\nset yrange [0:*]\nset y2range [0:*]\n"
              "plot 'speed.dat' using 1:2 with lines lw 1.5 title 'tokens/s', "
              "'' using 1:3 axes x1y2 with lines lw 1.5 title 'MFU %'\n",
      {{"speed.dat", speed.text()}}));
  if (!skip.names.empty()) {
    // Without a single ratio gnuplot has no range for the load panel: it
    // is left out and the title says why.
    const std::string load_panel =
        any_ratio ? "set multiplot layout 2,1\nset xlabel 'step'\n"
                    "set ylabel 'expert load max/min (gaps: an expert got no token)'\n"
                    "set logscale y\n" +
                        plot_blocks("load.dat", load, "1:2", "lines") + "unset logscale y\n"
                  : "set xlabel 'step'\nset label 1 'expert load max/min: none (some expert got "
                    "no token at every step)' at graph 0.02, graph 0.95\n";
    out.push_back(render(out_dir, "router.png",
                         title + load_panel + "set ylabel 'skip rate (%)'\nset yrange [0:" +
                             std::to_string(std::max(1.0, 1.1 * max_skip)) + "]\n" +
                             plot_blocks("skip.dat", skip, "1:2", "lines") +
                             (any_ratio ? "unset multiplot\n" : ""),
                         {{"load.dat", load.text()}, {"skip.dat", skip.text()}}));
  }
  return out;
}

std::vector<std::string> plot_bench(const std::string& path, const std::string& out_dir) {
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw InputError("--bench: " + path + ": not valid JSON (" + e.what() + ")");
  }
  const std::string kind = j.is_object() ? j.value("benchmark", std::string()) : "";
  std::vector<std::string> out;
  try {
    if (kind == "comm") {
      std::map<std::string, Blocks> by_op;
      for (const auto& p : j.at("points")) {
        if (p.contains("wrong") && p["wrong"].is_number() && p["wrong"].get<double>() > 0) continue;
        by_op[p.at("op").get<std::string>()].block(p.at("algo").get<std::string>()) +=
            row({p.at("bytes").get<double>(), p.at("busbw_gbs").get<double>()});
      }
      if (by_op.empty()) throw InputError("--bench: " + path + ": no points");
      make_dir(out_dir);
      for (const auto& [op, b] : by_op) {
        out.push_back(render(
            out_dir, "comm-" + op + ".png",
            "set title " + quote(op + ", " + j.value("ranks", json(0)).dump() + " ranks, " +
                                 j.value("dtype", std::string())) +
                " noenhanced\nset xlabel 'message size (bytes)'\nset ylabel 'bus bandwidth (GB/s)'\n"
                "set logscale x 2\nset logscale y\nset format x '2^{%L}'\n" +
                plot_blocks("comm.dat", b, "1:2", "linespoints pt 7 ps 0.8 lw 1.5"),
            {{"comm.dat", b.text()}}));
      }
    } else if (kind == "gemm") {
      Blocks b;
      for (const auto& r : j.at("rows"))
        b.block(r.at("dtype").get<std::string>()) +=
            row({r.at("flops").get<double>(), r.at("gflops").get<double>()});
      if (b.names.empty()) throw InputError("--bench: " + path + ": no rows");
      make_dir(out_dir);
      out.push_back(render(out_dir, "gemm.png",
                           "set title 'GEMM' noenhanced\nset xlabel 'FLOPs per GEMM'\n"
                           "set ylabel 'GFLOP/s'\nset logscale x 10\nset format x '10^{%L}'\nset yrange [0:*]\n" +
                               plot_blocks("gemm.dat", b, "1:2", "points pt 7 ps 1"),
                           {{"gemm.dat", b.text()}}));
    } else {
      throw InputError("--bench: " + path + ": benchmark " + (kind.empty() ? "?" : kind) +
                       " (expected the --json of anvil bench comm or anvil bench gemm)");
    }
  } catch (const json::exception& e) {
    throw InputError("--bench: " + path + ": " + e.what());
  }
  return out;
}

}  // namespace anvil::eval
