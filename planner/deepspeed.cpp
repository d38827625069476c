#include "planner/deepspeed.hpp"

#include <algorithm>
#include <cmath>

#include "model/analysis.hpp"
#include "model/units.hpp"

namespace memwall::planner {
namespace {

int stage_of(const Placement& pl) {
  return pl.param16.partitioned ? 3 : pl.grad16.partitioned ? 2 : pl.optim32.partitioned ? 1 : 0;
}

}  // namespace

Result<std::string> deepspeed_precision(const HardwareProfile& p, const std::string& given) {
  if (given.empty()) return std::string(p.gpu_bf16 ? "bf16" : "fp16");
  if (given != "bf16" && given != "fp16") return make_error("--precision: expected bf16 or fp16, got \"" + given + "\"");
  if (given == "bf16" && !p.gpu_bf16)
    return make_error("--precision bf16: the profile " + p.name + "'s GPU has no bf16 (gpu.bf16: false; V100 and "
                      "older compute fp16)");
  return given;
}

std::string deepspeed_cannot(const Placement& pl) {
  if (pl.layer_major) return "l2l's layer-major schedule is not a DeepSpeed schedule";
  const bool nvme_state = pl.param16.tier == Tier::nvme || pl.grad16.tier == Tier::nvme || pl.optim32.tier == Tier::nvme;
  if ((nvme_state || pl.param16.tier != Tier::gpu) && stage_of(pl) < 3)
    return nvme_state ? "DeepSpeed swaps states to NVMe only in stage 3 (stages 1 and 2 keep device nvme in CPU memory)"
                      : "DeepSpeed offloads parameters only in stage 3";
  if (pl.optim32.tier != Tier::gpu && pl.grad16.tier == Tier::gpu)
    return "DeepSpeed's optimizer offload moves the gradients to CPU memory with the optimizer states";
  if (pl.act_ckpt.tier == Tier::nvme) return "DeepSpeed has no NVMe activation checkpoints (cpu_checkpointing only)";
  return "";
}

Result<SearchSpace> deepspeed_space(SearchSpace space, bool overlap_fixed) {
  Result<SearchSpace> narrowed = narrow_placements(std::move(space), deepspeed_cannot, "--for deepspeed");
  if (!narrowed) return narrowed;
  SearchSpace s = std::move(narrowed).value();
  s.pp = {1};
  if (!overlap_fixed) s.overlaps = {OptimizerOverlap::none};
  for (OptimizerOverlap ov : s.overlaps)
    if (ov == OptimizerOverlap::dpu)
      return make_error("--for deepspeed: optimizer_overlap=dpu: DeepSpeed has no delayed parameter update (ZenFlow's "
                        "overlap_step delays only the gradients outside its top-k columns)");
  return s;
}

std::string DeepSpeedExport::notes() const {
  std::string out = "DeepSpeed config exported by memwall plan: ZeRO stage " + std::to_string(stage) +
                    (stage == planned_stage ? "" : " (the plan is stage " + std::to_string(planned_stage) + ")") + "\n";
  out += "\nDifferences from the plan (DeepSpeed cannot run it exactly as planned):\n";
  if (differences.empty()) out += "  none\n";
  for (const std::string& d : differences) out += "  - " + d + "\n";
  out += "\nChanges your training script must make:\n";
  if (code_changes.empty()) out += "  none\n";
  for (const std::string& c : code_changes) out += "  - " + c + "\n";
  return out;
}

Result<DeepSpeedExport> deepspeed_export(const ModelSpec& m, const Candidate& planned, const DeepSpeedOptions& opt) {
  const std::string& nvme_path = opt.nvme_path;
  const TrainingConfig& k = planned.config;
  if (k.bsz != std::floor(k.bsz))
    return make_error("--deepspeed: train_micro_batch_size_per_gpu must be an integer, the plan has bsz " + format_g(k.bsz));
  if (planned.placement.layer_major)
    return make_error("--deepspeed: the plan is l2l's layer-major schedule, which DeepSpeed does not have");
  if (k.pp > 1)
    return make_error("--deepspeed: the plan has " + std::to_string(k.pp) +
                      " pipeline stages, which DeepSpeed runs only from model code (deepspeed.pipe.PipelineModule with "
                      "num_stages); the export writes ZeRO configs (plan with --fix pp=1 for one)");
  DeepSpeedExport out;
  Candidate c = planned;
  Placement& pl = c.placement;
  out.planned_stage = stage_of(pl);
  // DeepSpeed swaps to NVMe (offload_optimizer nvme, offload_param) only in stage 3: stages 1 and 2
  // take device "nvme" as CPU offload without a word (stage_1_and_2.py), which would break the
  // plan's CPU memory check. The nearest plan DeepSpeed runs partitions everything.
  const bool nvme_state = pl.param16.tier == Tier::nvme || pl.grad16.tier == Tier::nvme || pl.optim32.tier == Tier::nvme;
  const bool offloaded_params = pl.param16.tier != Tier::gpu;
  if ((nvme_state || offloaded_params) && out.planned_stage < 3) {
    pl.param16.partitioned = pl.grad16.partitioned = pl.optim32.partitioned = true;
    out.differences.push_back(
        std::string("stage 3 instead of the plan's stage ") + std::to_string(out.planned_stage) + ": " +
        (nvme_state ? "DeepSpeed swaps states to NVMe only in stage 3 (in stages 1 and 2 it silently keeps them in CPU "
                      "memory, beyond the plan's CPU memory check)"
                    : "DeepSpeed offloads parameters (offload_param) only in stage 3") +
        "; parameters are partitioned too, which adds their all-gather per layer to the plan's traffic");
  }
  out.stage = stage_of(pl);
  if (pl.optim32.tier != Tier::gpu && pl.grad16.tier == Tier::gpu)
    out.differences.push_back("gradients: the plan keeps them on the GPU; DeepSpeed's optimizer offload moves them to "
                              "CPU memory with the optimizer states");
  if (pl.act_ckpt.tier == Tier::nvme)
    out.differences.push_back("activation checkpoints: the plan puts them on NVMe; DeepSpeed's cpu_checkpointing keeps "
                              "them in CPU memory (it has no NVMe checkpoints)");

  // Swap buffers hold one parameter partition each: round the largest one up to 1 Mi elements so
  // DeepSpeed's alignment padding cannot push it past the buffer ("more elements than buffer size").
  const double mi = 1 << 20;
  const auto largest = (long long)(std::ceil(std::max(largest_partition_elems(m, c, State::param16),
                                                      largest_partition_elems(m, c, State::optim32)) / mi) * mi);
  const auto op_elems = (long long)std::ceil(mswm_bytes(m) / 4.0 / k.mp / k.tiling_factor);  // fc1 (tile), Eq. 4's operator
  nlohmann::ordered_json zero = {{"stage", out.stage}, {"overlap_comm", true}, {"contiguous_gradients", true},
                                 {"reduce_bucket_size", op_elems}};
  if (out.stage == 3) {
    // depth 0 fetches on demand: DeepSpeed's parameter coordinator prefetches only with a bucket above 0
    zero["stage3_prefetch_bucket_size"] = k.prefetch_depth == 0 ? 0 : op_elems * std::max(1, k.prefetch_depth - 1);
    zero["stage3_max_live_parameters"] = op_elems * std::max(1, k.prefetch_depth);
    zero["stage3_param_persistence_threshold"] = 10LL * m.hidden;
    zero["sub_group_size"] = largest;
  }
  bool nvme = false;
  // SuperOffload (offload_config.py super_offload, DeepSpeed 0.18 and later; stage 3, NVIDIA GPUs)
  // steps CPU Adam on each sub-group as backward completes its gradients: the plan's overlap
  // "backward", exact. It runs asynchronously only without gradient clipping
  // (superoffload_stage3.py: `not self.clip_grad`), so the config sets gradient_clipping 0.
  const bool super_offload = k.optimizer_overlap == OptimizerOverlap::backward && out.stage == 3 &&
                             pl.optim32.tier == Tier::cpu;
  if (pl.param16.tier != Tier::gpu) {  // stage 3 here
    nlohmann::ordered_json op = {{"device", to_string(pl.param16.tier)}};
    if (pl.param16.tier == Tier::nvme) {
      op["nvme_path"] = nvme_path;
      op["buffer_count"] = 5;
      op["buffer_size"] = largest;
      op["max_in_cpu"] = largest;
      nvme = true;
    }
    op["pin_memory"] = true;  // the default only from DeepSpeed 0.19.5
    zero["offload_param"] = op;
  }
  if (pl.optim32.tier != Tier::gpu) {
    nlohmann::ordered_json oo = {{"device", to_string(pl.optim32.tier)}};
    if (pl.optim32.tier == Tier::nvme) {  // stage 3 here
      oo["nvme_path"] = nvme_path;
      oo["buffer_count"] = 4;  // at least Adam's four tensors per parameter
      oo["fast_init"] = false;
      // the plan's NVMe optimizer is a pipeline of chunks (read the next, update this one, write
      // the last back): PipelinedOptimizerSwapper's async swap-in and swap-out of neighbouring
      // sub-groups (pipelined_optimizer_swapper.py, chosen in stage3.py when either is set)
      oo["pipeline_read"] = true;
      oo["pipeline_write"] = true;
      nvme = true;
    }
    oo["pin_memory"] = true;
    if (super_offload) oo["super_offload"] = true;
    zero["offload_optimizer"] = oo;
  }
  const bool cpu_ckpt = pl.act_ckpt.tier != Tier::gpu;
  if (k.optimizer_overlap == OptimizerOverlap::backward && pl.optim32.tier != Tier::gpu && !super_offload)
    out.differences.push_back(
        "optimizer: the plan runs CPU Adam beside backward (optimizer_overlap backward); DeepSpeed runs it in step() "
        "after backward (stage3.py step()), and SuperOffload, its overlapped CPU Adam, is exported only for stage 3 "
        "with the optimizer states in CPU memory: plan with --for deepspeed for DeepSpeed's iteration time");
  if (k.optimizer_overlap == OptimizerOverlap::dpu)
    out.differences.push_back(
        "optimizer: the plan delays the parameter update by one step beside the next forward and backward (dpu); "
        "DeepSpeed has no such mode and runs the optimizer after backward: plan with --for deepspeed for its timing");
  if (cpu_ckpt && !pl.act_ckpt.partitioned && k.mp > 1)
    out.differences.push_back("activation checkpoints: DeepSpeed's cpu_checkpointing needs partition_activations, "
                              "so each of the " + std::to_string(k.mp) + " tensor-slicing ranks offloads 1/" +
                              std::to_string(k.mp) + " of each checkpoint and all-gathers it for the recompute; the "
                              "plan counts whole checkpoints (act_ckpt=cpu/p is the plan DeepSpeed runs)");
  out.config = {
      {"train_micro_batch_size_per_gpu", long(k.bsz)},
      {"gradient_accumulation_steps", k.grad_accum},
      {"train_batch_size", long(k.bsz) * k.grad_accum * k.dp},
      // CPU Adam (DeepSpeedCPUAdam) where the optimizer states are offloaded, fused Adam otherwise;
      // DeepSpeed's own default learning rate: set yours
      {"optimizer",
       {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.0}}}}},
      {"zero_optimization", zero},
      {"activation_checkpointing",
       {{"partition_activations", pl.act_ckpt.partitioned || cpu_ckpt},  // cpu_checkpointing works only with it
        {"cpu_checkpointing", cpu_ckpt},
        {"contiguous_memory_optimization", false},
        {"synchronize_checkpoint_boundary", false},
        {"profile", false}}},
  };
  // one of the two (runtime/config.py:827: "bfloat16 and fp16 modes cannot be simultaneously enabled")
  if (opt.precision == "bf16") out.config["bf16"] = {{"enabled", true}};
  else out.config["fp16"] = {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 16}};
  if (super_offload) out.config["gradient_clipping"] = 0.0;
  else if (k.grad_clip > 0) out.config["gradient_clipping"] = k.grad_clip;  // the global norm, as the plan's
  if (nvme)
    out.config["aio"] = {{"block_size", 1048576}, {"queue_depth", 8}, {"intra_op_parallelism", 1},
                         {"single_submit", false}, {"overlap_events", true}};

  // What the config cannot say.
  out.code_changes.push_back(
      "activation checkpoints every " + std::to_string(k.ci) + " block(s) (" + std::to_string((m.layers + k.ci - 1) / k.ci) +
      " checkpoints): call deepspeed.checkpointing.configure(mpu, deepspeed_config=<this file>) and wrap each group of " +
      std::to_string(k.ci) + " block(s) in deepspeed.checkpointing.checkpoint(...); the activation_checkpointing "
      "section is read only by configure() and has no interval key");
  if (k.tiling_factor > 1)
    out.code_changes.push_back("memory-centric tiling " + std::to_string(k.tiling_factor) +
                               ": replace every Linear with deepspeed.zero.TiledLinear (in_splits x out_splits = " +
                               std::to_string(k.tiling_factor) + "); offload_param.buffer_size holds the largest "
                               "parameter partition only then");
  if (k.mp > 1)
    out.code_changes.push_back("tensor slicing " + std::to_string(k.mp) + ": build the model with Megatron-LM's tensor "
                               "parallelism and pass its mpu to deepspeed.initialize(mpu=...); without it DeepSpeed counts "
                               "all " + std::to_string(k.dp * k.mp) + " ranks as data-parallel and train_batch_size (" +
                               std::to_string(long(k.bsz) * k.grad_accum * k.dp) +
                               " = micro-batch x gradient accumulation x dp " + std::to_string(k.dp) +
                               ") fails its check");
  if (pl.optim32.tier != Tier::gpu)
    out.code_changes.push_back("let DeepSpeed build the optimizer from the config's \"optimizer\" section (it becomes "
                               "DeepSpeedCPUAdam); an optimizer of your own must be DeepSpeedCPUAdam when states are "
                               "offloaded");
  out.code_changes.push_back("optimizer: AdamW at DeepSpeed's default lr 1e-3 is a placeholder; set your learning rate "
                             "and weight decay");
  if (super_offload)
    out.code_changes.push_back("SuperOffload (offload_optimizer.super_offload) needs DeepSpeed 0.18 or later on NVIDIA "
                               "GPUs, and overlaps CPU Adam with backward only without gradient clipping: keep "
                               "gradient_clipping 0 (with clipping it steps after backward, as plain ZeRO-Offload)");
  return out;
}

}  // namespace memwall::planner
