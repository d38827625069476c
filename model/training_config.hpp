// TrainingConfig: how one iteration is run, independent of where states live: micro-batch per GPU,
// sequence length, checkpoint interval, tiling factor, data- and tensor-parallel degrees, prefetch
// depth. Defaults are the paper's (seq 1024, ci 1, prefetch i+3/i+2/i+1). Value type.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/result.hpp"

namespace memwall {

// When the CPU optimizer runs (issue "Beyond ZeRO-Infinity's schedule"):
//   none      after the whole backward pass (ZeRO-Infinity, Sec. 5.2.2);
//   backward  each chunk as soon as the gradients of its parameters are final, beside the rest of
//             the backward pass (Fuyou/Ratel, GreedySnake); exact;
//   dpu       the update of iteration i beside the forward and backward of iteration i+1, whose
//             parameters are one step stale (ZeRO-Offload's delayed parameter update, after
//             `dpu_warmup` ordinary steps): changes the training dynamics.
enum class OptimizerOverlap { none, backward, dpu };
const char* to_string(OptimizerOverlap o);
Result<OptimizerOverlap> parse_optimizer_overlap(const std::string& s);

// What-ifs from seed 004 (DeepSpeed's blog), fixed by the user and never searched by the planner.
// Plan and simulate honour them; the executor refuses them (it neither compresses gradients nor
// runs block-sparse kernels).
//   1-bit Adam: the iteration is one of the compression stage (after the warm-up): every gradient
//     collective carries 1 bit per element plus one fp32 scale per piece (onebit_bytes), and each
//     rank keeps fp32 error feedback, 4 B per parameter of its optimizer shard, on optim32's tier.
//   attention_density: block-sparse attention computes this share of the score blocks: the score
//     and context FLOPs and the score matrices (Eq. 5's 2·heads·seq term) scale by it.
struct WhatIf {
  bool onebit_adam = false;
  double onebit_warmup = 0.15;    // share of training steps run as plain Adam first (the blog's 15 %);
                                  // only the end-to-end averages use it (onebit_end_to_end)
  double attention_density = 1;   // (0, 1]; 1 = dense
};

struct TrainingConfig {
  double bsz = 1;          // micro-batch per GPU (Table 1 uses 1.25: an average over GPUs)
  long seq = 1024;         // tokens per sample
  int ci = 1;              // transformer blocks between activation checkpoints
  int tiling_factor = 1;   // memory-centric tiling of linear operators (Sec. 5.1.3)
  int dp = 0;              // data-parallel degree; 0 = every GPU not used by mp
  int mp = 1;              // tensor-slicing degree inside a node
  // Tensor slicing's embeddings: split by vocabulary over the mp ranks (Megatron-LM's, what plan and
  // simulate assume), or whole on each (the executor's: its head then needs no vocabulary-parallel
  // cross-entropy, at the embedding's memory on every mp rank). No effect at mp 1.
  bool embedding_replicated = false;
  int prefetch_depth = 3;  // nc for op i+3, cg for i+2, gg for i+1 (Sec. 6.2)
  int micro_batches = 1;   // l2l: micro-batches looped inside each layer (seed 002, Sec. 2)
  int grad_accum = 1;      // gradient accumulation: forward/backward micro-steps per optimizer step
                           // (with pp > 1: the pipeline's micro-batches, run 1F1B)
  int pp = 1;              // pipeline stages (3D parallelism): each holds a contiguous range of blocks
  int virtual_stages = 1;  // interleaved 1F1B (Megatron-LM's virtual pipeline): each stage holds this many
                           // chunks of blocks (stage_chunks), the bubble / v at v x the p2p messages
  int ep = 1;              // expert parallelism (a mixture of experts): the routed experts split over
                           // ep consecutive dp ranks, tokens exchanged all-to-all; divides dp
  OptimizerOverlap optimizer_overlap = OptimizerOverlap::none;
  int dpu_warmup = 40;     // dpu: ordinary steps before the delayed update starts (ZeRO-Offload's)
  int optimizer_chunks = 0;  // chunks of the NVMe optimizer pipeline (Sec. 5.2.2); 0: enough that
                             // reads, updates and writes overlap, within the pinned budget
  // Gradient-norm clipping (torch.nn.utils.clip_grad_norm_): the gradients of a step are scaled by
  // min(1, grad_clip / (||g|| + 1e-6)), ||g|| the L2 norm over every parameter of the model, before
  // any update. 0: off. The norm needs every gradient final, so the backward overlap is refused.
  double grad_clip = 0;
  // ZeRO-Offload's owner scheme (fetch: broadcast, dp > 1) as DeepSpeed's stage 2 ran it before
  // v0.4.0: each owner's gradient copy to CPU memory holds up its next backward compute (the device
  // is synchronized before each bucket's reduce), so the owners copy one rank at a time (PR #1067).
  // The paper's Fig. 8 baseline; memwall's own executor copies beside the backward (false).
  bool sync_grad_copies = false;
  // ZeRO-3 as DeepSpeed v0.3.15-v0.5.x ran it: torch.cuda.synchronize() before each parameter's
  // all-gather (partition_parameters.py), so a fetch to the GPU waits for all of its rank's device
  // work issued before it (computes, collectives, copies to and from CPU memory); NVMe reads and
  // writes, on the host, do not wait. Prefetching beside a compute is then impossible, and the
  // gradients' reduce-scatters and copies are exposed before the next fetch. Not pipeline sends and
  // receives (DeepSpeed's ZeRO-3 ran without stages). memwall's executor synchronizes nothing (false).
  bool sync_fetches = false;
  WhatIf what_if;
};

// The ranks the token and position embeddings (and an untied LM head) are split over: mp, or 1
// when they are replicated (TrainingConfig::embedding_replicated).
inline int embedding_mp(const TrainingConfig& c) { return c.embedding_replicated ? 1 : std::max(1, c.mp); }

// Samples per optimizer step over all ranks: micro-batch x gradient-accumulation steps x dp
// (dp resolved, as fit_to_profile leaves it).
inline double global_batch(const TrainingConfig& c) { return c.bsz * c.grad_accum * c.dp; }

// The blocks pipeline stage `stage` of `pp` holds: [first, last), as even as whole blocks allow.
struct StageBlocks {
  int first = 0, last = 0;
};
inline StageBlocks stage_blocks(int layers, int pp, int stage) {
  return {int(long(stage) * layers / pp), int(long(stage + 1) * layers / pp)};
}
// Interleaved 1F1B: the `v` chunks stage `stage` of `pp` holds, in block order; chunk k is virtual
// stage k x pp + stage of pp x v (Narayanan et al. 2021, Sec. 2.2.2). One chunk, the stage's
// blocks, when v is 1.
std::vector<StageBlocks> stage_chunks(int layers, int pp, int v, int stage);
// The blocks of all of a stage's chunks.
int stage_block_count(int layers, int pp, int v, int stage);
// The passes a pipeline stage runs in one step, 1F1B: (pp - stage - 1) forwards first, then one
// forward and one backward in turn, then the remaining backwards. Interleaved over v chunks
// (Narayanan et al. 2021, Sec. 2.2.2) the passes are (micro-batch, chunk) pairs taken in groups of
// pp micro-batches, chunk by chunk (forward chunks 0..v-1, backward v-1..0), and a stage runs
// 2 (pp - stage - 1) + (v - 1) pp forwards before its first backward; micro_batches is then a
// multiple of pp (validate_ranges).
struct PipelinePass {
  bool forward;
  int micro_batch;
  int chunk;
};
std::vector<PipelinePass> pipeline_order(int pp, int v, int micro_batches, int stage);
// The most chunk passes whose checkpoints a stage holds at once (forwards run, backwards not yet).
int pipeline_in_flight(int pp, int v, int micro_batches, int stage);
// 1F1B's idle share of a pipeline of `pp` stages over `micro_batches` micro-batches,
// (p-1)/(m+p-1); interleaved over v chunks a stage's idle time shrinks v-fold: (p-1)/(v m+p-1).
inline double pipeline_bubble(int pp, int micro_batches, int v = 1) {
  return double(pp - 1) / (double(std::max(1, v)) * micro_batches + pp - 1);
}

// Physical memory of this machine (sysconf), for limits that bound work.
double machine_memory_bytes();

// Upper bounds of a training config (the paper uses bsz <= 32, tiling <= 16, mp <= 8). The flags
// and file readers check against these; validate() repeats the check for configs built in code.
inline constexpr double kMaxBsz = 65536;
inline constexpr int kMaxTiling = 4096;
inline constexpr int kMaxMp = 1024;              // kMaxGpusPerNode
inline constexpr long kMaxGpus = 1L << 26;        // kMaxNodes x kMaxGpusPerNode: dp x mp stays below it
inline constexpr int kMaxPrefetchDepth = 64;
inline constexpr int kMaxMicroBatches = 4096;
inline constexpr int kMaxGradAccum = 65536;
inline constexpr int kMaxPp = 1024;
inline constexpr int kMaxDpuWarmup = 1000000;
inline constexpr int kMaxOptimizerChunks = 100000;
inline constexpr double kMaxGradClip = 1e9;
// Checks ranges; `layers` bounds ci. Messages name the flag ("--ci: ..."). Also refuses a config
// whose schedule (about layers x tiling x micro-batches steps) would not fit in an eighth of this
// machine's memory, naming the largest value of the flag that would (schedule_size_check).
Result<TrainingConfig> validate(const TrainingConfig& config, int layers);
// The ranges alone, for the closed-form analysis (no schedule is built).
Result<TrainingConfig> validate_ranges(const TrainingConfig& config, int layers);

// dp, mp and pp against a profile: mp divides a node's GPUs (tensor slicing stays inside a node) and
// dp x mp x pp is at most the profile's GPUs; dp 0 becomes every GPU / (mp x pp).
Result<TrainingConfig> fit_to_profile(const TrainingConfig& config, const HardwareProfile& profile);
// The data-parallel degree alone: config.dp, or 0 resolved to every GPU / (mp x pp), checked
// against the profile's GPUs (the one message for --dp/--mp/--pp: fit_to_profile, build_schedule
// and the simulator all ask here).
Result<int> resolve_dp(const TrainingConfig& config, const HardwareProfile& profile);

// Steps build_schedule makes for one rank, estimated from above (plus `optimizer_chunks` chunked
// optimizer updates), and the bytes they take.
double estimated_schedule_steps(const TrainingConfig& config, int layers, double optimizer_chunks = 0);
double estimated_schedule_bytes(const TrainingConfig& config, int layers, double optimizer_chunks = 0);
// The check validate() makes with this machine's memory; exposed so tests can pass a memory size.
Result<TrainingConfig> schedule_size_check(const TrainingConfig& config, int layers, double memory_bytes);

// The same check with everything that sizes a schedule: also the optimizer's chunks when its
// states are on NVMe (one per pinned-buffer third: a profile with a tiny cpu.pinned_budget and a
// large model makes billions). Call before build_schedule with input from a user.
Result<TrainingConfig> check_schedule_size(const ModelSpec& model, const Placement& placement,
                                           const TrainingConfig& config, const HardwareProfile& profile,
                                           double memory_bytes = machine_memory_bytes());


}  // namespace memwall
