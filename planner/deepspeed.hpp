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

#include "model/hardware_profile.hpp"
#include "model/result.hpp"
#include "planner/fit.hpp"
#include "planner/search.hpp"

namespace memwall::planner {

struct DeepSpeedExport {
  nlohmann::ordered_json config;
  int planned_stage = 0;                  // the ZeRO stage memwall's plan is
  int stage = 0;                          // the stage exported (3 where DeepSpeed needs it for NVMe)
  std::vector<std::string> differences;   // how DeepSpeed will run it differently from the plan
  std::vector<std::string> code_changes;  // what the training script must do for the plan to hold
  std::string notes() const;              // both lists as the companion note's text
};

struct DeepSpeedOptions {
  std::string nvme_path = "/local_nvme";
  std::string precision = "fp16";  // bf16 or fp16 (deepspeed_precision gives the profile's)
};

// bf16 where the profile's GPU computes it (gpu.bf16: Ampere and later), fp16 otherwise; `given`
// (--precision) when not empty, checked (bf16 on a GPU without it is refused).
Result<std::string> deepspeed_precision(const HardwareProfile& p, const std::string& given);

// Fails (one line) on what no DeepSpeed config expresses: a fractional micro-batch, a layer-major
// (l2l) schedule.
Result<DeepSpeedExport> deepspeed_export(const ModelSpec& m, const Candidate& c, const DeepSpeedOptions& o = {});

// Why stock DeepSpeed (0.19) cannot run this placement as planned, or "" when it can: NVMe or
// parameter offload below stage 3, gradients kept on the GPU while the optimizer is offloaded, NVMe
// checkpoints, l2l's layer-major schedule.
std::string deepspeed_cannot(const Placement& pl);

// `memwall plan --for deepspeed`: the space narrowed to what DeepSpeed runs as planned, so the
// prediction is DeepSpeed's: placements deepspeed_cannot accepts; no pipeline stages (PipelineModule
// is model code); the CPU optimizer after backward, as ZeRO-Offload's step() runs it (stage3.py
// step(), stage_1_and_2.py step()), unless `overlap_fixed` (--fix optimizer_overlap=backward: the
// export then turns on SuperOffload). Fails when no placement is left, with the reason of the first.
Result<SearchSpace> deepspeed_space(SearchSpace s, bool overlap_fixed);

}  // namespace memwall::planner
