// The Megatron-LM export of a plan: the command line of Megatron-LM's pretrain_gpt.py (torchrun
// across dp x mp x pp processes) that trains the planned model with the plan's tensor slicing,
// pipeline stages, batch arithmetic, recomputation and optimizer partitioning, checked against
// Megatron-LM's own argument parser and validate_args (NVIDIA/Megatron-LM at d98e8a64, core
// 0.20.0: megatron/training/arguments.py and the config dataclasses its flags are generated from),
// plus what the flags cannot say:
//  - differences: where Megatron-LM runs the plan differently (gradients whole on every rank, the
//    vocabulary padded, checkpoints in GPU memory), and what changes;
//  - what the user must supply (data, tokenizer, learning rate).
// Plans Megatron-LM cannot run at all (parameters partitioned or offloaded, states on NVMe, l2l)
// are refused with the reason: megatron_cannot says which, and `plan --for megatron` searches only
// the others. Pure functions over value types.
#pragma once

#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/result.hpp"
#include "planner/fit.hpp"
#include "planner/search.hpp"

namespace memwall::planner {

struct MegatronExport {
  std::vector<std::string> args;          // pretrain_gpt.py's flags and values, in order
  std::vector<std::string> env;           // NAME=VALUE the processes need (CUDA_DEVICE_MAX_CONNECTIONS)
  int nodes = 1, gpus_per_node = 1;       // torchrun's --nnodes and --nproc-per-node
  std::vector<std::string> differences;   // how Megatron-LM will run it differently from the plan
  std::vector<std::string> user_changes;  // what the user must supply or set
  std::string script() const;             // a POSIX shell script: torchrun ... pretrain_gpt.py ARGS "$@"
  std::string notes() const;              // both lists as the companion note's text
};

// Why Megatron-LM cannot run this placement, or "" when it can: parameters partitioned (ZeRO-3)
// or offloaded, gradients or optimizer states on NVMe, l2l's layer-major schedule.
std::string megatron_cannot(const Placement& pl);

// `precision` is bf16 or fp16 (deepspeed_precision picks the profile's). Fails (one line) on a plan
// Megatron-LM cannot run: megatron_cannot, a fractional micro-batch, heads not divisible by mp,
// layers not divisible by pp, a checkpoint interval above a stage's layers.
Result<MegatronExport> megatron_export(const ModelSpec& m, const Candidate& c, const HardwareProfile& p,
                                       const std::string& precision);

// `memwall plan --for megatron`: placements megatron_cannot accepts, the optimizer after backward
// (Megatron-LM's optimizer.step() follows backward), pipeline stages only where the layers split
// evenly. Fails when no placement is left.
Result<SearchSpace> megatron_space(SearchSpace s, const ModelSpec& m);

}  // namespace memwall::planner
