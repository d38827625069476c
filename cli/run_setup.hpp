// The inputs `memwall run` and `memwall validate` share: a run config or a plan, the profile,
// the strategy flags, the NVMe folder and the step count, turned into the engine's options in one
// place, so what validate executes is what run executes.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cli_common.hpp"
#include "exec/engine/engine.hpp"
#include "exec/engine/run_config.hpp"

namespace memwall::cli {

struct RunInputs {
  std::string config;
  std::string plan;
  ProfileFlags profile;
  StrategyFlags run;
  std::string nvme_dir;
  std::optional<int> steps;  // the run config's when not given
  RunInputs();  // strategy data_parallel, profile local-cpu
  // --config, --plan, --profile, --nodes, --gpus, the strategy flags, --nvme-dir, --steps
  void add(CLI::App& app, const std::string& steps_help);
};

struct PreparedRun {
  exec::RunConfig rc;             // steps, corpus, model as the run trains it
  exec::EngineOptions options;    // model, placement, config, profile, backend, precision, lr, seed, nvme_dir
};

// Loads and checks everything (throws UsageError naming the flag or file); `sub` tells which flags
// were given.
PreparedRun prepare_run(const RunInputs& in, const CLI::App& sub);

}  // namespace memwall::cli
