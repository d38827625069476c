// Helpers shared by the `memwall` subcommands: turning flags into validated model objects, the
// one-line error convention (exit 2 for bad input), text tables and atomic output files.
// Subcommands only parse and wire; anything worth testing lives in the libraries.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/training_config.hpp"
#include "model/result.hpp"

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

// --profile, --nodes
struct ProfileFlags {
  std::string profile = "dgx2";
  int nodes = -1;  // -1 = as the profile says
  void add(CLI::App& app);
  HardwareProfile load() const;
};

// --model or --layers/--hidden/--heads, plus --seq and --vocab
struct ModelFlags {
  std::string model;
  int layers = 0;
  std::string hidden;
  int heads = 0;
  long seq = 0;  // 0 = the model's
  long vocab = 0;
  void add(CLI::App& app);
  bool given() const { return !model.empty() || layers > 0 || !hidden.empty() || heads > 0; }
  ModelSpec load() const;
};

// --strategy, --place and the training flags shared by `schedule` and `simulate`.
struct StrategyFlags {
  std::string strategy = "zero_inf_nvme";
  std::vector<std::string> place;
  TrainingConfig config;
  void add(CLI::App& app);
  Placement placement() const;                           // preset or YAML plus --place overrides
  TrainingConfig training(const ModelSpec& model, const Placement& placement) const;  // validated
};

// A plain text table: first row is the header; columns after the first are right-aligned.
std::string render_table(const std::vector<std::vector<std::string>>& rows, int indent = 2);

// Writes `text` to `path` through a temporary file and rename, so a failure leaves nothing
// half-written; "-" or empty means stdout.
void write_output(const std::string& path, const std::string& text);

}  // namespace memwall::cli
