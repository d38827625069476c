// The inputs `memwall run` and `memwall validate` share: a run config or a plan, the profile,
// the strategy flags, the NVMe folder and the step count, turned into the engine's options in one
// place, so what validate executes is what run executes.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

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
  TokensFlag tokens;         // --tokens, for the time-to-train figure
  RunInputs();  // strategy data_parallel, profile local-cpu
  // --config, --plan, --profile, --nodes, --gpus, the strategy flags, --nvme-dir, --steps, --tokens
  void add(CLI::App& app, const std::string& steps_help);
};

struct PreparedRun {
  exec::RunConfig rc;             // steps, corpus, model as the run trains it
  exec::EngineOptions options;    // model, placement, config, profile, backend, precision, lr, seed, nvme_dir
};

// Loads and checks everything (throws UsageError naming the flag or file); `sub` tells which flags
// were given.
PreparedRun prepare_run(const RunInputs& in, const CLI::App& sub);

// `--json` of run and validate is JSON Lines: one object per step as it completes ("type": "step",
// printed and flushed at once, so a long run can be followed with `tail -f` or a pipe), then one
// summary ("type": "summary"). This is a step's line.
nlohmann::ordered_json step_line(int step, const exec::IterationReport& r, double tokens_per_s);
// On the cpu backend a kernel runs on the dispatcher's thread, so a transfer beside it is seen
// complete only when the kernel ends: the caveat under measured busy times (run and validate).
extern const char* const kCpuBusyCaveat;
// The throughput of the engine's run at `iteration_s` per iteration (results/METRICS.md): every
// rank's micro-batches, the schedule's compute FLOPs per rank.
Throughput run_throughput(const exec::Engine& engine, const HardwareProfile& profile, double iteration_s,
                          double train_tokens);
// Which iterations a run's times are the median of: all after the first when there are more than
// two (model/timeline.hpp's steady_from). "step 3", or "median of steps 2-8", for steps
// `first_step` .. `last_step`.
std::string steady_statistic(int first_step, int last_step);
// Prints one JSON Lines object and flushes.
void print_line(const nlohmann::ordered_json& j);

}  // namespace memwall::cli
