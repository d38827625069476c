// Helpers shared by the `memwall` subcommands: turning flags into validated model objects, the
// one-line error convention (exit 2 for bad input), text tables and atomic output files. Every
// numeric flag goes through add_int / add_number / parse_quantity_flag: the one place where flag
// values are range-checked (and NaN, infinity and overflow refused) before anything narrows them.
// Subcommands only parse and wire; anything worth testing lives in the libraries.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/training_config.hpp"
#include "model/result.hpp"
#include "model/throughput.hpp"
#include "model/units.hpp"

namespace memwall::cli {

// Bad input: main prints "memwall <cmd>: <message>" on one line and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename T>
T take(Result<T> r) {
  if (!r) throw UsageError(r.error());
  return std::move(r).value();
}

// An integer flag in [lo, hi]: "--nodes 0", "--nodes 4294967296", "--nodes 2.5" are refused as
// CLI11 reads them ("--nodes: expected an integer from 1 to 65536, got \"0\""), exit 2.
CLI::Option* add_int(CLI::App& app, const std::string& name, int& target, long lo, long hi, const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& name, long& target, long lo, long hi, const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& name, std::optional<int>& target, long lo, long hi,
                     const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& name, std::optional<long>& target, long lo, long hi,
                     const std::string& help);
// A number flag > 0 and <= hi (NaN and infinity refused).
CLI::Option* add_number(CLI::App& app, const std::string& name, double& target, double hi, const std::string& help);

// A quantity flag ("2 GiB", "100M") in its dimension's range and within [lo, hi]; throws UsageError
// naming the flag.
double parse_quantity_flag(const std::string& flag, const std::string& text, Dimension d, double lo, double hi);

// --profile, --nodes
struct ProfileFlags {
  std::string profile = "dgx2";
  std::optional<int> nodes;  // unset: as the profile says
  std::optional<int> gpus;   // unset: as the profile says (per node; --gpus, where add_gpus was called)
  void add(CLI::App& app);
  void add_gpus(CLI::App& app);
  HardwareProfile load() const;
};

// --model or --layers/--hidden/--heads, plus --seq and --vocab
struct ModelFlags {
  std::string model;
  std::string model_config;  // a Hugging Face config.json
  std::optional<int> layers;
  std::string hidden;
  std::optional<int> heads;
  std::optional<long> seq;  // unset: the model's
  std::optional<long> vocab;
  void add(CLI::App& app);
  bool given() const { return !model.empty() || !model_config.empty() || layers || !hidden.empty() || heads; }
  ModelSpec load() const;
};

// --strategy, --place and the training flags shared by `schedule`, `simulate` and `run`.
// Seed 004's what-ifs (--onebit-adam, --onebit-adam-warmup, --attention-density), range-checked.
void add_what_if_flags(CLI::App& app, WhatIf& what_if);
// --grad-clip N (TrainingConfig::grad_clip): plan's and the commands that take StrategyFlags
void add_grad_clip_flag(CLI::App& app, double& clip);
struct StrategyFlags {
  std::string overlap = "none";  // --optimizer-overlap
  std::string strategy = "zero_inf_nvme";
  std::vector<std::string> place;
  TrainingConfig config;
  std::optional<int> micro_batches;  // --micro-batches as given (l2l's default 4 only when not given)
  std::vector<std::string> flags;    // every flag add() added, for the subcommands that refuse them together
  void add(CLI::App& app);
  // With a plan file, which fixes placement and training: a UsageError naming the first of these
  // flags that was given (none is ignored).
  void refuse_with_plan(const CLI::App& app) const;
  Placement placement() const;  // preset or YAML plus --place overrides
  // Validated, with dp and mp checked against the profile (mp divides a node's GPUs, dp x mp fits),
  // and the schedule's size against this machine's memory: of every pipeline stage, or of the
  // largest one when only one is built (`one_stage`).
  TrainingConfig training(const ModelSpec& model, const Placement& placement, const HardwareProfile& profile,
                          bool one_stage = false) const;
  // Checkpoints partitioned across the tensor-slicing ranks need mp > 1: a UsageError naming the
  // placement file or --place otherwise.
  void check_ckpt_partition(const Placement& placement, int mp) const;
};

// --tokens: the tokens the "time to train" figure counts ("300B"; default 20 per parameter).
struct TokensFlag {
  std::string tokens;
  void add(CLI::App& app);
  double value() const;  // 0 when not given (throughput() then takes its default)
};

// The throughput fields of every JSON report (results/METRICS.md, "Throughput and utilisation").
nlohmann::ordered_json throughput_json(const Throughput& t);

// A job's rank layout in words: "dp 2", "dp 2, mp 2, pp 2", "dp 1, pp 4 interleaved x2" (mp, pp and
// the virtual stages when above 1).
std::string layout_words(int dp, int mp, int pp, int virtual_stages = 1);

// A plain text table: first row is the header; columns after the first are right-aligned.
std::string render_table(const std::vector<std::vector<std::string>>& rows, int indent = 2);

// Writes `text` to `path` through a temporary file beside it and a rename, so a failure leaves
// nothing half-written and no temporary file; "-" or empty means stdout (a failed write to stdout,
// such as a full disk behind a redirection, is an error too).
void write_output(const std::string& path, const std::string& text);
// Before any work: `path` (a file write_output will write; "-" or empty: stdout) can be written:
// its folder exists and takes a new file, and it is neither a folder nor a link. UsageError naming
// `flag` otherwise.
void check_output_file(const std::string& flag, const std::string& path);
// Before any work: folder `path` exists or is made (its parent must exist) and takes new files.
void make_output_folder(const std::string& flag, const std::string& path);
// The folders make_output_folder made in this process; main removes each one left empty when the
// command fails (a bad flag found after it: nothing half-made is left behind).
const std::vector<std::string>& made_output_folders();

}  // namespace memwall::cli
