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

Result<DeepSpeedExport> deepspeed_export(const ModelSpec& m, const Candidate& planned, const std::string& nvme_path) {
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
  const auto op_elems = (long long)std::ceil(mswm_bytes_eq4(m.hidden) / 4.0 / k.mp / k.tiling_factor);  // fc1 (tile), Eq. 4's operator
  nlohmann::ordered_json zero = {{"stage", out.stage}, {"overlap_comm", true}, {"contiguous_gradients", true},
                                 {"reduce_bucket_size", op_elems}};
  if (out.stage == 3) {
    zero["stage3_prefetch_bucket_size"] = op_elems * std::max(1, k.prefetch_depth - 1);
    zero["stage3_max_live_parameters"] = op_elems * std::max(1, k.prefetch_depth);
    zero["stage3_param_persistence_threshold"] = 10LL * m.hidden;
    zero["sub_group_size"] = largest;
  }
  bool nvme = false;
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
      nvme = true;
    }
    oo["pin_memory"] = true;
    zero["offload_optimizer"] = oo;
  }
  const bool cpu_ckpt = pl.act_ckpt.tier != Tier::gpu;
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
      {"fp16", {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 16}}},
      {"zero_optimization", zero},
      {"activation_checkpointing",
       {{"partition_activations", pl.act_ckpt.partitioned || cpu_ckpt},  // cpu_checkpointing works only with it
        {"cpu_checkpointing", cpu_ckpt},
        {"contiguous_memory_optimization", false},
        {"synchronize_checkpoint_boundary", false},
        {"profile", false}}},
  };
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
  return out;
}

}  // namespace memwall::planner
