// The training loop `memwall run` and `memwall validate` share (DESIGN.md: the CLI only parses and
// wires): this rank's part of each global batch from the corpus, one Engine::step per training
// step, a stop on a loss that is not finite, checkpoints every K steps and at the end, and a
// callback per step for the caller to print or record. Every rank draws the same global batch, so
// the data does not depend on how many ranks share it, and a resumed run continues the same order.
// Thread-safety: the engine's thread; collectives inside (call on every rank).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "exec/engine/engine.hpp"
#include "exec/engine/run_config.hpp"

namespace memwall::exec {

// The data order's seed: run and validate draw the same batches (a resumed run continues from the
// generator state its checkpoint recorded).
inline std::uint64_t data_seed(const RunConfig& rc) { return rc.seed ^ 0x5eedba7c4ull; }

// This rank's part of the next global batch: every rank draws the same batch of sequences x ranks
// and keeps its own `sequences` of it in `tokens` and `targets`. `all_*` are scratch kept between steps.
struct RankBatch {
  std::vector<int> tokens, targets, all_tokens, all_targets;
  void next(const Corpus& corpus, std::uint64_t& rng, int sequences, int seq, int rank, int ranks);
};

struct TrainOptions {
  int first_step = 1, last_step = 1;  // inclusive, 1-based
  std::uint64_t data_rng = 0;         // the batch generator before first_step (data_seed, or a checkpoint's)
  std::string save_dir;               // checkpoints: every save_every steps (0: at the end only), and at the end
  int save_every = 0;
};

struct TrainResult {
  float first_loss = 0;
  IterationReport last;
  std::vector<double> iteration_s;  // per step
  std::vector<OverlapReport> overlap;  // per step
  std::uint64_t data_rng = 0;       // after the last step
};

// Called after each step with its number and report; an error it returns stops the run.
using OnStep = std::function<Result<bool>(int step, const IterationReport& report)>;

// Runs steps first_step .. last_step on `engine` with batches of `seq` tokens. An error names the
// step ("step 7: ..."): an engine error, a loss that is not finite, a failed checkpoint.
Result<TrainResult> train(Engine& engine, const Corpus& corpus, int seq, const TrainOptions& options,
                          const OnStep& on_step = {});

}  // namespace memwall::exec
