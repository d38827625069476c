// The inputs `memwall run` and `memwall validate` share: a run config or a plan, the profile,
// the strategy flags, the NVMe folder and the step count, turned into the engine's options in one
// place, so what validate executes is what run executes.
#pragma once

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
  int steps = 0;
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

// This rank's part of the next global batch: every rank draws the same batch of
// sequences x ranks (so the data does not depend on how many ranks share it) and keeps its own
// `sequences` of it in `tokens` and `targets`. `all_*` are scratch the caller keeps between steps.
// The data order's seed: run and validate (and a resumed run, from its checkpoint) draw the same.
inline std::uint64_t data_rng(const exec::RunConfig& rc) { return rc.seed ^ 0x5eedba7c4ull; }
struct RankBatch {
  std::vector<int> tokens, targets, all_tokens, all_targets;
  void next(const exec::Corpus& corpus, std::uint64_t& rng, int sequences, int seq, int rank, int ranks);
};

}  // namespace memwall::cli
