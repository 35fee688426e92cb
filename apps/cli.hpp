// What every command family of the command line shares: the family
// interface main() registers, flags made from a library's declared options
// (base/options.hpp), validators that say what a value must be, the one
// dtype vocabulary, sizes, JSON/CSV/table output, and the mapping from
// errors to exit statuses.
//
// Exit statuses, for every command:
//   0  success
//   1  a difference was found (ckpt diff, data tokenize --verify) or the
//      run failed underneath (an I/O or system error)
//   2  bad input: a flag, a file, a config; one line on stderr, nothing written
//   3  a collective timed out (a rank stopped answering)
//   10, 11  anvil train: a NaN/Inf loss, repeated loss spikes (roll back)
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "anvil/base/dtype.hpp"
#include "anvil/base/files.hpp"
#include "anvil/base/options.hpp"

namespace anvil::cli {

inline constexpr int kExitDifference = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitTimeout = 3;

// State of one command-line parse, shared by the families: the arguments
// and, for errors, the flag each library option key is given by.
struct Context {
  int argc = 0;
  char** argv = nullptr;
  int rank = 0;  // under mpirun: this rank (only rank 0 reports bad input)
  // Under mpirun: every rank met the same bad input or training fault
  // (every_rank_fails); the others then exit 0 and leave the job's status
  // and its one line to rank 0.
  bool every_rank_failed = false;
  std::map<std::string, std::string> flag_of_key;
};

// Called on every rank that caught a bad input or a training fault while
// MPI is up: whether every rank did (a barrier with a deadline of 10 s; a
// rank that failed alone gets false). mpirun ends a job at its first
// non-zero exit and may drop output still on its way, so the ranks other
// than 0 must not exit non-zero before rank 0 has printed.
bool every_rank_fails();

// A family of commands (`anvil bench ...`, `anvil ckpt ...`): it adds its
// subcommands and flags, and runs the one the parse selected.
class CommandFamily {
 public:
  virtual ~CommandFamily() = default;
  virtual void add_to(CLI::App& app, Context& ctx) = 0;
  // The exit status of the selected command, or nullopt when it is not one of this family's.
  virtual std::optional<int> run(Context& ctx) = 0;
};

std::vector<std::unique_ptr<CommandFamily>> command_families();

// Parses, runs the selected command and maps errors to exit statuses.
int run_command_line(CLI::App& app, std::vector<std::unique_ptr<CommandFamily>>& families,
                     Context& ctx);

// Validators whose messages say what the value must be.
CLI::Validator at_least(double lo);
// A number's text, so a typo is named with what was expected rather than as
// a failed conversion; an unsigned whole number has no sign (CLI11 would wrap
// "-1" around).
enum class Number { real, whole, unsigned_whole };
CLI::Validator number_text(Number kind);
// An output path (base/files.hpp's output_path_problem), checked as the
// command line is read, before any work.
CLI::Validator output_file();
CLI::Validator output_dir();
CLI::Validator positive();  // > 0
CLI::Validator in_range(double lo, double hi);
CLI::Validator one_of(const std::vector<std::string>& choices);

// How errors name an option: its long flag, with long aliases ("--dtype/--precision").
std::string flag_words(const OptionInfo& info);

// A flag per option of `options` (a struct with describe(v)) in `section`,
// defaults shown in --help; options marked cli = false are left out, and so
// are keys in `skip`.
template <class Options>
void add_options(CLI::App* cmd, Options& options, const std::string& section, Context& ctx,
                 const std::string& group = "Options", const std::vector<std::string>& skip = {}) {
  walk_section(options, section, [&](const OptionInfo& info, auto& field, const auto&) {
    if (!info.cli) return;
    for (const auto& s : skip)
      if (s == info.key()) return;
    std::string names = info.long_flag();
    for (const auto& a : info.aliases) names += "," + a;
    CLI::Option* o;
    if constexpr (std::is_same_v<std::remove_reference_t<decltype(field)>, bool>) {
      o = cmd->add_flag(names, field, info.help);
    } else {
      o = cmd->add_option(names, field, info.help)->capture_default_str();
      using Field = std::remove_reference_t<decltype(field)>;
      if constexpr (std::is_unsigned_v<Field>) {
        o->check(number_text(Number::unsigned_whole));
      } else if constexpr (std::is_arithmetic_v<Field>) {
        o->check(number_text(std::is_integral_v<Field> ? Number::whole : Number::real));
      }
    }
    o->group(group);
    ctx.flag_of_key[info.key()] = flag_words(info);
  });
}

// A --dtype-style option: accepts the names and aliases of `allowed`
// (base/dtype.hpp) and stores `word(dtype)`, the name the library reads.
CLI::Option* add_dtype_option(CLI::App* cmd, const std::string& names, std::string& target,
                              std::initializer_list<Dtype> allowed, const std::string& help,
                              std::function<std::string(Dtype)> word = {});
// The same for a comma-separated list.
CLI::Option* add_dtype_list(CLI::App* cmd, const std::string& names,
                            std::vector<std::string>& target, std::initializer_list<Dtype> allowed,
                            const std::string& help, std::function<std::string(Dtype)> word = {});
// "f32" for fp32, the canonical name otherwise: the word of the hardware
// profiles and the benchmark tables.
// --device cpu|cuda (the device seam, device/runtime.hpp) into `target`.
CLI::Option* add_device_option(CLI::App* cmd, std::string& target, const std::string& help);

std::string profile_word(Dtype d);

// "4096", "64K", "1M", "2G", "1.5M" (binary multiples) -> a count of bytes
// or elements; InputError naming `flag` otherwise.
int64_t parse_size(const std::string& text, const std::string& flag);
std::vector<int64_t> parse_sizes(const std::vector<std::string>& texts, const std::string& flag);

// Where results go: a table (default), --json or --csv on stdout, and
// optionally --out FILE with the JSON, written atomically.
struct OutputFlags {
  bool json = false;
  bool csv = false;
  std::string out;
  void add_to(CLI::App* app, bool with_csv = true);
  template <typename Result>
  void emit(const Result& r, const std::string& footer) const {
    const auto j = r.to_json();
    if (!out.empty()) write_file_atomic(out, j.dump(2) + "\n");
    if (json) {
      std::cout << j.dump(2) << "\n";
    } else if (csv) {
      std::cout << r.to_table().to_csv();
    } else {
      std::cout << r.to_table().to_text() << footer;
    }
  }
};

bool under_mpirun();
// This process's rank as the launcher's environment gives it (0 outside
// mpirun), known before MPI starts: a bad flag is reported by rank 0 only.
int launcher_rank();

// Runs this same command under mpirun with `np` ranks, dropping --np.
[[noreturn]] void relaunch_under_mpirun(int argc, char** argv, int np);
// A collective timed out on this rank: every rank says what it waited for
// (one write, so ranks' lines do not interleave), gives the others time to
// say it too, then ends the job with status 3.
[[noreturn]] void abort_on_timeout(const std::exception& e);

}  // namespace anvil::cli
