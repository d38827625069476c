// The DeepSpeed export of a plan: the JSON config DeepSpeed's own config classes read, checked
// against DeepSpeed 0.19 (deepspeed/runtime/zero/config.py, zero/offload_config.py,
// swap_tensor/aio_config.py, runtime/config.py, activation_checkpointing/config.py), plus what the
// config cannot say:
//  - differences: where DeepSpeed cannot run the plan as planned, the nearest plan it runs (stage
//    1 or 2 with anything on NVMe becomes stage 3: DeepSpeed swaps to NVMe only in stage 3 and
//    otherwise silently keeps those states in CPU memory), and what changes;
//  - code changes the user must make (TiledLinear for tiling, deepspeed.checkpointing for the
//    checkpoint interval, Megatron's mpu for tensor slicing, the optimizer's learning rate).
// Pure functions over value types.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/result.hpp"
#include "planner/fit.hpp"

namespace memwall::planner {

struct DeepSpeedExport {
  nlohmann::ordered_json config;
  int planned_stage = 0;                  // the ZeRO stage memwall's plan is
  int stage = 0;                          // the stage exported (3 where DeepSpeed needs it for NVMe)
  std::vector<std::string> differences;   // how DeepSpeed will run it differently from the plan
  std::vector<std::string> code_changes;  // what the training script must do for the plan to hold
  std::string notes() const;              // both lists as the companion note's text
};

// Fails (one line) on what no DeepSpeed config expresses: a fractional micro-batch, a layer-major
// (l2l) schedule.
Result<DeepSpeedExport> deepspeed_export(const ModelSpec& m, const Candidate& c,
                                         const std::string& nvme_path = "/local_nvme");

}  // namespace memwall::planner
