// anvil: the command line. main() registers the command families (one file
// each, owning its flags and help), parses, and hands the exit status back;
// the statuses and the error format are cli.hpp's.
#include "cli.hpp"

namespace anvil::cli {

std::unique_ptr<CommandFamily> make_bench_commands();
std::unique_ptr<CommandFamily> make_train_commands();
std::unique_ptr<CommandFamily> make_eval_commands();
std::unique_ptr<CommandFamily> make_plan_commands();
std::unique_ptr<CommandFamily> make_ckpt_commands();
std::unique_ptr<CommandFamily> make_data_commands();

std::vector<std::unique_ptr<CommandFamily>> command_families() {
  std::vector<std::unique_ptr<CommandFamily>> families;
  families.push_back(make_bench_commands());  // hw, bench
  families.push_back(make_train_commands());  // train, launch
  families.push_back(make_eval_commands());   // eval, generate, plot
  families.push_back(make_plan_commands());   // size, plan
  families.push_back(make_ckpt_commands());   // ckpt
  families.push_back(make_data_commands());   // data
  return families;
}

}  // namespace anvil::cli

int main(int argc, char** argv) {
  CLI::App app{
      "anvil: a training stack for Mixture-of-Experts language models (after ZAYA1).\n"
      "Microbenchmarks, hardware profiles and a planner; a trainer (dense and ZAYA1,\n"
      "distributed, phased recipes), evaluation, sampling, and Hugging Face interop.\n"
      "Exit status: 0 success, 1 a difference found or a run failed, 2 bad input,\n"
      "3 a collective timed out, 10/11 a NaN loss / repeated spikes (roll back),\n"
      "12 a straggler to leave out, 13 replicas whose weights differ at a save,\n"
      "130/143 train stopped by SIGINT/SIGTERM at a step boundary (checkpoint written)."};
  app.set_version_flag("--version", std::string("anvil ") + "0.1.0");
  app.require_subcommand(1);
  app.get_formatter()->column_width(36);
  anvil::cli::Context ctx;
  ctx.argc = argc;
  ctx.argv = argv;
  ctx.rank = anvil::cli::launcher_rank();  // before MPI starts: errors in the flags
  auto families = anvil::cli::command_families();
  for (auto& family : families) family->add_to(app, ctx);
  return anvil::cli::run_command_line(app, families, ctx);
}
