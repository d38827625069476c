#include "model/training_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/model_spec.hpp"
#include "model/units.hpp"

namespace memwall {
namespace {

std::string range_error(const char* flag, const char* what, long lo, long hi, long got) {
  return std::string(flag) + ": expected " + what + " from " + std::to_string(lo) + " to " + std::to_string(hi) +
         ", got " + std::to_string(got);
}

// Measured on build_schedule (dgx2, hidden 4K-160K): zero_inf_nvme makes 125-136 steps per layer plus 72
// per extra tile, l2l about 38 per layer and micro-batch; a step takes 420-620 bytes (its deps,
// buffers and name). Rounded up, so the estimate bounds every placement from above
// (tests/model/test_schedule_size.cpp checks that it still does).
constexpr double kStepsBase = 300;  // embedding, final LayerNorm, head, unchunked optimizer
constexpr double kStepsPerLayer = 150;
constexpr double kStepsPerTilePerLayer = 75;
constexpr double kBytesPerStep = 640;
// The schedule's consumers (JSON, the simulator's activities) take several times its size again.
constexpr double kMemoryShare = 1.0 / 8;
// An optimizer chunk: its reads, the update and its writes; a chunk buffer holds at most the fp32
// states and two 16-bit (or fp32, in the executor) copies per parameter.
constexpr double kStepsPerChunk = 8;
constexpr double kChunkBytesPerParam = 24;

}  // namespace

double machine_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 4.0 * (1 << 30);
}

double estimated_schedule_steps(const TrainingConfig& c, int layers, double optimizer_chunks) {
  return kStepsBase + double(layers) * (kStepsPerLayer + kStepsPerTilePerLayer * (c.tiling_factor - 1)) *
                          c.micro_batches * std::max(1, c.grad_accum) +
         kStepsPerChunk * optimizer_chunks;
}

double estimated_schedule_bytes(const TrainingConfig& c, int layers, double optimizer_chunks) {
  return estimated_schedule_steps(c, layers, optimizer_chunks) * kBytesPerStep;
}

Result<TrainingConfig> check_schedule_size(const ModelSpec& m, const Placement& pl, const TrainingConfig& c,
                                           const HardwareProfile& p, double memory_bytes) {
  Result<TrainingConfig> ok = schedule_size_check(c, m.layers, memory_bytes);
  if (!ok || pl.optim32.tier != Tier::nvme) return ok;
  // The optimizer runs in chunks of a third of the rank's pinned buffers, at least 4096 parameters.
  const double params = 12.0 * m.layers * double(m.hidden) * double(m.hidden) + double(m.vocab) * double(m.hidden);
  const double dp = c.dp > 0 ? c.dp : double(p.total_gpus()) / c.mp;
  const double per_rank = (pl.optim32.partitioned ? params / dp : params) / c.mp;
  const double chunk = std::max(4096.0, std::floor(p.pinned_budget_bytes / p.gpus_per_node / (3 * kChunkBytesPerParam)));
  const double chunks = std::ceil(per_rank / chunk);
  const double need = estimated_schedule_bytes(c, m.layers, chunks);
  if (need <= memory_bytes * kMemoryShare) return c;
  return make_error(p.source + ": cpu.pinned_budget: " + format_bytes(p.pinned_budget_bytes) + " per node cuts the optimizer of " +
                    format_count(per_rank) + " parameters per rank into about " + format_count(chunks) +
                    " chunks, a schedule of " + format_bytes(need) + ", more than the eighth of this machine's " +
                    format_bytes(memory_bytes) + " memory a schedule may take");
}

Result<TrainingConfig> schedule_size_check(const TrainingConfig& c, int layers, double memory_bytes) {
  const double budget = memory_bytes * kMemoryShare;
  const double need = estimated_schedule_bytes(c, layers);
  if (need <= budget) return c;
  // Blame the knob the user turned: tiling, then micro-batches, then layers; say how far it may go.
  std::string flag = "--layers";
  long now = layers, most = long(double(layers) * budget / need);
  if (c.tiling_factor > 1) {
    flag = "--tiling";
    now = c.tiling_factor;
    TrainingConfig one = c;
    one.tiling_factor = 1;
    const double base = estimated_schedule_bytes(one, layers);
    const double per_tile =
        double(layers) * kStepsPerTilePerLayer * c.micro_batches * std::max(1, c.grad_accum) * kBytesPerStep;
    most = budget > base ? 1 + long((budget - base) / per_tile) : 0;
  } else if (c.grad_accum > 1) {
    flag = "--grad-accum";
    now = c.grad_accum;
    most = long(double(c.grad_accum) * budget / need);
  } else if (c.micro_batches > 1) {
    flag = "--micro-batches";
    now = c.micro_batches;
    most = long(double(c.micro_batches) * budget / need);
  }
  return make_error(flag + ": " + std::to_string(now) + " makes a schedule of about " +
                    format_count(estimated_schedule_steps(c, layers)) + " steps (" + format_bytes(need) +
                    "), more than the eighth of this machine's " + format_bytes(memory_bytes) + " memory a schedule may take" +
                    (most >= 1 ? " (at most " + std::to_string(most) + " here)" : ""));
}

const char* to_string(OptimizerOverlap o) {
  switch (o) {
    case OptimizerOverlap::none: return "none";
    case OptimizerOverlap::backward: return "backward";
    case OptimizerOverlap::dpu: return "dpu";
  }
  return "?";
}

Result<OptimizerOverlap> parse_optimizer_overlap(const std::string& s) {
  if (s == "none") return OptimizerOverlap::none;
  if (s == "backward") return OptimizerOverlap::backward;
  if (s == "dpu") return OptimizerOverlap::dpu;
  return make_error("--optimizer-overlap: expected none, backward or dpu, got \"" + s + "\"");
}

Result<TrainingConfig> validate_ranges(const TrainingConfig& c, int layers) {
  if (!(c.bsz > 0) || !(c.bsz <= kMaxBsz))
    return make_error("--bsz: expected a micro-batch per GPU > 0 and at most " + format_g(kMaxBsz) + ", got " +
                      format_sig(c.bsz));
  if (c.seq < 1 || c.seq > kMaxSeq) return make_error(range_error("--seq", "a sequence length", 1, kMaxSeq, c.seq));
  if (c.ci < 1 || c.ci > layers)
    return make_error("--ci: expected a checkpoint interval between 1 and the model's " + std::to_string(layers) +
                      " layers, got " + std::to_string(c.ci));
  if (c.tiling_factor < 1 || c.tiling_factor > kMaxTiling)
    return make_error(range_error("--tiling", "a tiling factor", 1, kMaxTiling, c.tiling_factor));
  if (c.dp < 0 || c.dp > kMaxGpus)
    return make_error(range_error("--dp", "a data-parallel degree", 1, kMaxGpus, c.dp));
  if (c.mp < 1 || c.mp > kMaxMp) return make_error(range_error("--mp", "a tensor-slicing degree", 1, kMaxMp, c.mp));
  if (c.ep < 1 || c.ep > kMaxExperts)
    return make_error(range_error("--ep", "an expert-parallel degree", 1, kMaxExperts, c.ep));
  if (long(c.dp) * c.mp > kMaxGpus)
    return make_error("--dp/--mp: " + std::to_string(c.dp) + " x " + std::to_string(c.mp) + " GPUs, more than " +
                      std::to_string(kMaxGpus));
  if (c.prefetch_depth < 0 || c.prefetch_depth > kMaxPrefetchDepth)
    return make_error(range_error("--prefetch-depth", "a prefetch distance", 0, kMaxPrefetchDepth, c.prefetch_depth));
  // A pass has 6 parameter groups per block plus the embedding and the final LayerNorm; looking
  // further ahead than that wraps into the next pass (build_schedule then breaks an invariant).
  if (long most = 6L * layers + 1; c.prefetch_depth > most)
    return make_error("--prefetch-depth: expected at most " + std::to_string(most) + " for " + std::to_string(layers) +
                      " layer(s) (one pass has " + std::to_string(most + 1) + " parameter groups), got " +
                      std::to_string(c.prefetch_depth));
  if (c.micro_batches < 1 || c.micro_batches > kMaxMicroBatches)
    return make_error(range_error("--micro-batches", "a count", 1, kMaxMicroBatches, c.micro_batches));
  if (c.pp < 1 || c.pp > std::min(kMaxPp, layers))
    return make_error("--pp: expected a number of pipeline stages from 1 to " + std::to_string(std::min(kMaxPp, layers)) +
                      " (each stage holds at least one of the model's " + std::to_string(layers) + " blocks), got " +
                      std::to_string(c.pp));
  if (c.virtual_stages < 1 || long(c.virtual_stages) * c.pp > layers)
    return make_error("--virtual-stages: expected 1 to " + std::to_string(layers / std::max(1, c.pp)) +
                      " chunks per pipeline stage (each chunk holds at least one of the model's " +
                      std::to_string(layers) + " blocks over " + std::to_string(c.pp) + " stage(s)), got " +
                      std::to_string(c.virtual_stages));
  if (c.virtual_stages > 1 && c.pp < 2)
    return make_error("--virtual-stages: interleaving needs pipeline stages (--pp 2 or more), got --pp " +
                      std::to_string(c.pp));
  if (long(c.dp) * c.mp * c.pp > kMaxGpus)
    return make_error("--dp/--mp/--pp: " + std::to_string(long(c.dp) * c.mp * c.pp) + " GPUs, more than " +
                      std::to_string(kMaxGpus));
  if (c.grad_accum < 1 || c.grad_accum > kMaxGradAccum)
    return make_error(range_error("--grad-accum", "a number of micro-steps", 1, kMaxGradAccum, c.grad_accum));
  if (c.virtual_stages > 1 && c.grad_accum % c.pp != 0)
    return make_error("--grad-accum: interleaved 1F1B runs micro-batches in groups of pp; expected a multiple of --pp " +
                      std::to_string(c.pp) + ", got " + std::to_string(c.grad_accum));
  if (c.dpu_warmup < 0 || c.dpu_warmup > kMaxDpuWarmup)
    return make_error(range_error("--dpu-warmup", "a number of steps", 0, kMaxDpuWarmup, c.dpu_warmup));
  if (!(c.grad_clip >= 0) || !(c.grad_clip <= kMaxGradClip))
    return make_error("--grad-clip: expected the largest global gradient norm, > 0 (0: no clipping) and at most " +
                      format_g(kMaxGradClip) + ", got " + format_sig(c.grad_clip));
  if (c.optimizer_chunks < 0 || c.optimizer_chunks > kMaxOptimizerChunks)
    return make_error(
        range_error("--optimizer-chunks", "a chunk count (0: automatic)", 0, kMaxOptimizerChunks, c.optimizer_chunks));
  if (!(c.what_if.attention_density > 0) || !(c.what_if.attention_density <= 1))
    return make_error("--attention-density: expected a share of attention blocks > 0 and at most 1, got " +
                      format_sig(c.what_if.attention_density));
  if (!(c.what_if.onebit_warmup >= 0) || !(c.what_if.onebit_warmup < 1))
    return make_error("--onebit-adam-warmup: expected a share of the training steps >= 0 and below 1, got " +
                      format_sig(c.what_if.onebit_warmup));
  return c;
}

std::vector<StageBlocks> stage_chunks(int layers, int pp, int v, int stage) {
  pp = std::max(1, pp);
  v = std::max(1, v);
  std::vector<StageBlocks> out;
  for (int k = 0; k < v; ++k) out.push_back(stage_blocks(layers, pp * v, k * pp + stage));
  return out;
}

int stage_block_count(int layers, int pp, int v, int stage) {
  int n = 0;
  for (const StageBlocks& b : stage_chunks(layers, pp, v, stage)) n += b.last - b.first;
  return n;
}

std::vector<PipelinePass> pipeline_order(int pp, int v, int micro_batches, int stage) {
  pp = std::max(1, pp);
  v = std::max(1, v);
  const int total = micro_batches * v;
  auto pass = [&](bool fwd, int i) {
    if (v == 1) return PipelinePass{fwd, i, 0};
    const int k = (i % (pp * v)) / pp;
    return PipelinePass{fwd, (i / (pp * v)) * pp + i % pp, fwd ? k : v - 1 - k};
  };
  const int warmup = std::min(v == 1 ? pp - stage - 1 : 2 * (pp - stage - 1) + (v - 1) * pp, total);
  std::vector<PipelinePass> order;
  for (int i = 0; i < warmup; ++i) order.push_back(pass(true, i));
  for (int j = 0; j < total - warmup; ++j) {
    order.push_back(pass(true, warmup + j));
    order.push_back(pass(false, j));
  }
  for (int j = total - warmup; j < total; ++j) order.push_back(pass(false, j));
  return order;
}

int pipeline_in_flight(int pp, int v, int micro_batches, int stage) {
  int now = 0, most = 0;
  for (const PipelinePass& p : pipeline_order(pp, v, micro_batches, stage)) {
    now += p.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

Result<TrainingConfig> fit_to_profile(const TrainingConfig& config, const HardwareProfile& p) {
  TrainingConfig c = config;
  if (c.mp < 1 || c.mp > p.gpus_per_node || p.gpus_per_node % c.mp != 0)
    return make_error("--mp: tensor slicing stays inside a node of " + std::to_string(p.gpus_per_node) +
                      " GPUs: expected a divisor of " + std::to_string(p.gpus_per_node) + ", got " + std::to_string(c.mp));
  Result<int> dp = resolve_dp(c, p);
  if (!dp) return make_error(dp.error());
  c.dp = *dp;
  if (c.dp % std::max(1, c.ep) != 0)
    return make_error("--ep: the experts split over ep of the " + std::to_string(c.dp) +
                      " data-parallel ranks: expected a divisor of dp " + std::to_string(c.dp) + ", got " +
                      std::to_string(c.ep));
  return c;
}

Result<int> resolve_dp(const TrainingConfig& c, const HardwareProfile& p) {
  const long total = p.total_gpus();
  const long pp = std::max(1, c.pp), mp = std::max(1, c.mp);
  const long dp = c.dp > 0 ? c.dp : total / (mp * pp);
  if (dp < 1 || dp * mp * pp > total)
    return make_error("--dp/--mp" + std::string(pp > 1 ? "/--pp: " : ": ") + std::to_string(dp) + " x " +
                      std::to_string(mp) + (pp > 1 ? " x " + std::to_string(pp) : std::string()) +
                      " GPUs asked, profile " + p.name + " has " + std::to_string(total) + "; add nodes with --nodes");
  return int(dp);
}

Result<TrainingConfig> validate(const TrainingConfig& c, int layers) {
  Result<TrainingConfig> ok = validate_ranges(c, layers);
  if (!ok) return ok;
  return schedule_size_check(c, layers, machine_memory_bytes());
}

}  // namespace memwall
