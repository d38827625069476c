// Plan files: the YAML that `memwall plan -o` writes and `memwall simulate --plan` / `memwall run
// --plan` read: profile, model shape, placement, training config and the predicted time. Loading
// validates every field with file:line:field errors and cross-checks the plan against a profile
// (GPU count, nodes, tensor slicing inside a node). The DeepSpeed export is planner/deepspeed.hpp.
// Pure functions over value types: thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/result.hpp"
#include "planner/fit.hpp"

namespace memwall::planner {

struct Plan {
  std::string profile;  // profile name (or path) the plan was made for
  int nodes = 1;
  int gpus = 0;         // dp x mp x pp
  std::string objective = "throughput";
  ModelSpec model;
  Candidate candidate;  // placement + training config
  // The global batch the plan was made for (`memwall plan --global-batch`): bsz x grad_accum x dp.
  // Nothing: the planner left it free (then it is whatever the chosen bsz x dp gives).
  std::optional<long> global_batch;
  double predicted_iteration_s = 0;     // analytic (Sec. 4-6)
  double predicted_tflops_per_gpu = 0;  // analytic
  // `memwall plan --simulate-top N`: the simulated iteration of the chosen plan, when it was
  // simulated, and which of the two ranked it first ("analytic" or "simulated").
  std::optional<double> simulated_iteration_s;
  std::optional<double> simulated_tflops_per_gpu;
  std::string ranking = "analytic";
};

std::string plan_yaml(const Plan& plan);

// `profile` (optional) is what the plan will run on: a plan naming more GPUs or nodes than it has,
// or tensor slicing across its nodes, is an error at the offending line.
Result<Plan> parse_plan(std::string_view yaml_text, const std::string& source, const HardwareProfile* profile = nullptr);
Result<Plan> load_plan(const std::string& path, const HardwareProfile* profile = nullptr);

}  // namespace memwall::planner
