#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "anvil/base/error.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/process.hpp"
#include "anvil/comm/communicator.hpp"
#include "anvil/ft/faults.hpp"

namespace anvil::cli {
namespace {

std::string number_text(double v) {
  return v == std::floor(v) && std::abs(v) < 1e15 ? std::to_string(static_cast<int64_t>(v))
                                                  : option_text(v);
}

// A library error names option keys ("train.batch"); the command line says
// the flag instead ("--batch").
std::string in_flag_words(std::string msg, const Context& ctx) {
  std::vector<std::pair<std::string, std::string>> keys(ctx.flag_of_key.begin(),
                                                        ctx.flag_of_key.end());
  std::sort(keys.begin(), keys.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  const auto word_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  };
  for (const auto& [key, flag] : keys) {
    for (size_t at = msg.find(key); at != std::string::npos; at = msg.find(key, at + flag.size())) {
      const size_t end = at + key.size();
      if ((at > 0 && word_char(msg[at - 1])) ||
          (end < msg.size() && word_char(msg[end]) && msg[end] != '.')) {
        at += 1;
        continue;
      }
      msg.replace(at, key.size(), flag);
    }
  }
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  return msg;
}

// CLI11 reports a missing subcommand before an unknown word; name the word.
std::string parse_error_text(CLI::App& app, const CLI::ParseError& e) {
  std::string msg = e.what();
  if (std::string(e.get_name()) != "RequiredError" || msg != "A subcommand is required") return msg;
  const CLI::App* at = &app;
  std::string where = "anvil";
  for (CLI::App* sub = app.get_subcommands().empty() ? nullptr : app.get_subcommands().front();
       sub != nullptr;
       sub = sub->get_subcommands().empty() ? nullptr : sub->get_subcommands().front()) {
    at = sub;
    where += " " + sub->get_name();
  }
  std::string expected;
  for (const CLI::App* s : at->get_subcommands({}))
    expected += (expected.empty() ? "" : ", ") + s->get_name();
  const auto rest = app.remaining(true);
  return rest.empty()
             ? where + ": expected a command (" + expected + ")"
             : where + ": unknown command '" + rest.front() + "' (expected " + expected + ")";
}

int fail(const std::string& what, int status) {
  std::cerr << "anvil: error: " << what << "\n";
  return status;
}

}  // namespace

bool every_rank_fails() {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return false;
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done != 0;
}

int run_command_line(CLI::App& app, std::vector<std::unique_ptr<CommandFamily>>& families,
                     Context& ctx) {
  try {
    app.parse(ctx.argc, ctx.argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (ctx.rank != 0) return kExitBadInput;  // every rank parsed the same flags
    return fail(in_flag_words(parse_error_text(app, e), ctx), kExitBadInput);
  }
  try {
    for (auto& f : families)
      if (const auto status = f->run(ctx)) return *status;
    return 0;
  } catch (const ft::TrainingFault& e) {
    // Every rank saw the same global loss; a supervisor rolls back.
    if (ctx.rank == 0) std::cerr << "\n";
    if (ctx.rank != 0) return ctx.every_rank_failed ? 0 : e.exit_code();
    return fail(e.what(), e.exit_code());
  } catch (const InputError& e) {
    if (ctx.rank != 0) return ctx.every_rank_failed ? 0 : kExitBadInput;
    return fail(in_flag_words(e.what(), ctx), kExitBadInput);
  } catch (const std::exception& e) {
    return fail(in_flag_words(e.what(), ctx), 1);
  }
}

std::string flag_words(const OptionInfo& info) {
  std::string words = info.long_flag();
  for (const auto& a : info.aliases)
    if (a.rfind("--", 0) == 0) words += "/" + a;
  return words;
}

namespace {

// A validator of numbers: `ok(value)`, else "must be <range>, got VALUE".
CLI::Validator number_validator(const std::string& range, std::function<bool(double)> ok) {
  return CLI::Validator(
      [range, ok](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0') return "expected a number, got '" + s + "'";
        if (!std::isfinite(v)) return "expected a finite number, got '" + s + "'";
        return ok(v) ? "" : "must be " + range + ", got " + s;
      },
      range);
}

}  // namespace

CLI::Validator at_least(double lo) {
  return number_validator(">= " + number_text(lo), [lo](double v) { return v >= lo; });
}

CLI::Validator number_text(Number kind) {
  return CLI::Validator(
      [kind](std::string& s) -> std::string {
        const bool whole = kind != Number::real;
        const bool negative = s.find('-') != std::string::npos;
        if (kind == Number::unsigned_whole && negative)  // CLI11 would wrap "-1" around
          return "expected a whole number >= 0, got '" + s + "'";
        char* end = nullptr;
        errno = 0;
        if (whole && !negative) {  // up to an unsigned 64-bit's range
          (void)std::strtoull(s.c_str(), &end, 10);
        } else if (whole) {
          (void)std::strtoll(s.c_str(), &end, 10);
        } else {
          (void)std::strtod(s.c_str(), &end);
        }
        if (end == s.c_str() || *end != '\0')
          return std::string(whole ? "expected a whole number" : "expected a number") + ", got '" +
                 s + "'";
        if (errno == ERANGE) return "out of range, got '" + s + "'";
        return "";
      },
      "");
}

namespace {
CLI::Validator output_validator(bool dir) {
  return CLI::Validator(
      [dir](std::string& s) -> std::string {
        if (s.empty()) return std::string("expected a path, got ''");
        const std::string why = output_path_problem(s, dir);
        return why.empty() ? "" : s + ": " + why;
      },
      "");
}
}  // namespace

CLI::Validator output_file() {
  return output_validator(false);
}

CLI::Validator output_dir() {
  return output_validator(true);
}

CLI::Validator positive() {
  return number_validator("> 0", [](double v) { return v > 0; });
}

CLI::Validator in_range(double lo, double hi) {
  return number_validator("in [" + number_text(lo) + ", " + number_text(hi) + "]",
                          [lo, hi](double v) { return v >= lo && v <= hi; });
}

CLI::Validator one_of(const std::vector<std::string>& choices) {
  const auto check = anvil::one_of(choices);
  return CLI::Validator(
      [check](std::string& s) -> std::string {
        const std::string why = check(s);
        return why.empty() ? "" : why + ", got '" + s + "'";
      },
      "");
}

namespace {

CLI::Validator dtype_transform(std::initializer_list<Dtype> allowed,
                               std::function<std::string(Dtype)> word) {
  std::vector<Dtype> kinds(allowed);
  if (!word) word = [](Dtype d) { return to_string(d); };
  return CLI::Validator(
      [kinds, word](std::string& s) -> std::string {
        for (const Dtype d : kinds) {
          try {
            if (parse_dtype(s, "", {d}) == d) {
              s = word(d);
              return "";
            }
          } catch (const InputError&) {
          }
        }
        std::string names;
        for (const Dtype d : kinds) names += (names.empty() ? "" : ", ") + to_string(d);
        return "expected " + names + ", got '" + s + "'";
      },
      "");
}

}  // namespace

CLI::Option* add_dtype_option(CLI::App* cmd, const std::string& names, std::string& target,
                              std::initializer_list<Dtype> allowed, const std::string& help,
                              std::function<std::string(Dtype)> word) {
  return cmd->add_option(names, target, help + " (" + dtype_names(allowed) + ")")
      ->transform(dtype_transform(allowed, std::move(word)))
      ->capture_default_str();
}

CLI::Option* add_dtype_list(CLI::App* cmd, const std::string& names,
                            std::vector<std::string>& target, std::initializer_list<Dtype> allowed,
                            const std::string& help, std::function<std::string(Dtype)> word) {
  return cmd->add_option(names, target, help + " (" + dtype_names(allowed) + ")")
      ->delimiter(',')
      ->transform(dtype_transform(allowed, std::move(word)))
      ->capture_default_str();
}

CLI::Option* add_device_option(CLI::App* cmd, std::string& target, const std::string& help) {
  return cmd->add_option("--device", target, help)
      ->check(one_of({"cpu", "cuda"}))
      ->capture_default_str();
}

std::string profile_word(Dtype d) {
  return d == Dtype::fp32    ? "f32"
         : d == Dtype::fp16  ? "f16"
         : d == Dtype::fp64  ? "f64"
         : d == Dtype::int32 ? "i32"
         : d == Dtype::int64 ? "i64"
                             : to_string(d);
}

int64_t parse_size(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  const std::string suffix = text.substr(pos);
  double mult = 1;
  if (suffix == "K" || suffix == "k")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "m")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g")
    mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    pos = 0;
  if (pos == 0 || !(value * mult >= 1))
    throw InputError(flag + ": expected a positive size like 4096, 64K, 1M or 2G, got '" + text +
                     "'");
  return static_cast<int64_t>(value * mult);
}

std::vector<int64_t> parse_sizes(const std::vector<std::string>& texts, const std::string& flag) {
  std::vector<int64_t> out;
  for (const auto& t : texts) out.push_back(parse_size(t, flag));
  return out;
}

void OutputFlags::add_to(CLI::App* app, bool with_csv) {
  auto* as_json = app->add_flag("--json", json, "Print JSON on stdout instead of the table");
  if (with_csv)
    app->add_flag("--csv", csv, "Print CSV on stdout instead of the table")->excludes(as_json);
  app->add_option("--out", out, "Also write the JSON result to this file (atomically)")
      ->check(output_file());
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

bool under_mpirun() {
  // Open MPI's mpirun, or srun with PMIx.
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

[[noreturn]] void relaunch_under_mpirun(int argc, char** argv, int np) {
  std::vector<std::string> args = {"mpirun"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"--oversubscribe", "-np", std::to_string(np), self_executable()});
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np") {
      ++i;
      continue;
    }
    if (a.rfind("--np=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  ::execvp("mpirun", cargs.data());
  std::cerr << "anvil: error: --np: cannot run mpirun (" << std::strerror(errno)
            << "); install openmpi-bin\n";
  std::exit(1);
}

[[noreturn]] void abort_on_timeout(const std::exception& e) {
  const std::string line = std::string("anvil: error: ") + e.what() + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  MPI_Abort(MPI_COMM_WORLD, kExitTimeout);
  std::abort();  // MPI_Abort does not return
}

}  // namespace anvil::cli
