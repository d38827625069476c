// memwall: the command. Parses flags, dispatches to one subcommand, turns bad input into one line
// on stderr and exit code 2. Nothing else lives here.
#include <iostream>
#include <vector>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"

int main(int argc, char** argv) {
  using namespace memwall::cli;
  CLI::App app{
      "memwall: see, plan and run transformer training that does not fit in GPU memory (ZeRO-Infinity).\n"
      "Run `memwall <command> --help` for the flags of one command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "memwall 0.1.0");

  const std::vector<Command> commands = {
      add_analyze(app),
      add_schedule(app),
      add_simulate(app),
      add_reproduce(app),
      add_models(app),
      add_profiles(app),
      add_io_bench(app),
      add_adam_bench(app),
      add_plan(app),
      add_run(app),
  };

  std::string name = "memwall";
  try {
    app.parse(argc, argv);
    for (auto& [sub, run] : commands)
      if (sub->parsed()) {
        name = "memwall " + sub->get_name();
        return run();
      }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    for (CLI::App* sub : app.get_subcommands({}))
      if (sub->parsed()) name = "memwall " + sub->get_name();
    std::cerr << name << ": " << e.what() << " (see " << name << " --help)\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 2;
  }
  return 2;
}
