// The table of `memwall` subcommands. Each adds itself to the app and returns its runner, which
// main calls when that subcommand was chosen. A new subcommand is one file and one line in main.cpp.
#pragma once

#include <functional>
#include <utility>

#include <CLI/CLI.hpp>

namespace memwall::cli {

using Runner = std::function<int()>;  // returns the exit code; throws UsageError on bad input
using Command = std::pair<CLI::App*, Runner>;

Command add_analyze(CLI::App& app);
Command add_schedule(CLI::App& app);
Command add_simulate(CLI::App& app);
Command add_reproduce(CLI::App& app);
Command add_models(CLI::App& app);
Command add_profiles(CLI::App& app);
Command add_io_bench(CLI::App& app);
Command add_adam_bench(CLI::App& app);
Command add_plan(CLI::App& app);
Command add_run(CLI::App& app);
Command add_calibrate(CLI::App& app);
Command add_validate(CLI::App& app);
Command add_completion(CLI::App& app);  // last: it walks the others

}  // namespace memwall::cli
