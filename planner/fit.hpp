// Memory fit and analytic iteration time of one planner candidate (placement x bsz x ci x tiling x
// mp x dp x pp) on a hardware profile. The bytes are the memory model's (model/memory.hpp: per
// rank, the peaks build_schedule walks, predicted in closed form); this file scales them to a node,
// checks them against the profile and says which limit binds and by how much. The time's closed
// forms (Eq. 1-11) are model/analysis.hpp's. Pure functions over value types: thread-safe.
#pragma once

#include <array>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/analysis.hpp"
#include "model/op_cost.hpp"
#include "model/hardware_profile.hpp"
#include "model/memory.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/training_config.hpp"

namespace memwall::planner {

// One point of the search space. config.dp is resolved (never 0); config.seq is the model's.
struct Candidate {
  Placement placement;
  TrainingConfig config;
};

enum class Resource { gpu_memory, gpu_largest_alloc, cpu_memory, pinned, nvme };
const char* to_string(Resource r);   // "GPU memory", "largest GPU allocation", "CPU memory", ...
const char* resource_key(Resource r);  // "gpu_memory", ... (JSON keys)

struct Part {
  std::string what;  // "param16 (1/dp shard)", "AWM (Eq. 5) of a segment's blocks", ...
  double bytes = 0;
};

struct LimitCheck {
  Resource resource = Resource::gpu_memory;
  const char* scope = "per GPU";  // "per GPU" or "per node"
  double needed_bytes = 0;
  double capacity_bytes = 0;
  std::vector<Part> parts;
  std::string moment;  // when in the iteration the peak is ("backward of block49.fc2"), if known
  bool fits() const { return needed_bytes <= capacity_bytes * (1 + 1e-12); }
  double use() const { return capacity_bytes > 0 ? needed_bytes / capacity_bytes : (needed_bytes > 0 ? 1e30 : 0); }
  double shortfall_bytes() const { return needed_bytes > capacity_bytes ? needed_bytes - capacity_bytes : 0; }
  // "CPU memory 1.50 TB < 2.05 TB needed per node" or "GPU memory 30.1 GiB of 32.0 GiB per GPU".
  std::string sentence() const;
};

struct FitOptions {
  double max_alloc_bytes = 0;  // largest contiguous GPU allocation (Sec. 8.5's 2 GB chunks); 0 = no limit
  // false: each check's numbers only (needed and capacity bytes), without its parts and moment: the
  // search's thousands of fits, whose kept candidates get their words afterwards
  bool words = true;
};

struct FitReport {
  std::vector<LimitCheck> checks;
  bool fits() const;
  const LimitCheck& binding() const;  // the most used limit (the first to break)
  double worst_use() const { return binding().use(); }
};

// Parameters the memory accounting counts: Eq. 1 plus the token and position embeddings (which
// Eq. 1 leaves out but which the GPT of model/operator_graph.hpp has).
double embedding_params(const ModelSpec& m);
// Elements of the largest tensor of state `s` one rank swaps (DeepSpeed's offload buffers must hold
// it): the fc1 weight (hd x 4hd, Eq. 4's operator) sliced by mp and tiling, or the embedding,
// divided over `dp` ranks when that state is partitioned.
double largest_partition_elems(const ModelSpec& m, const Candidate& c, State s);

FitReport check_fit(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const FitOptions& o = {});

// Analytic time of one iteration (Sec. 4-6): compute (Eq. 7-8 at the achievable peak) plus the part
// of each offloaded state's traffic that cannot hide behind it. Traffic time per state is Eq. 6's
// flops / (AIT x bandwidth) with the effective bandwidths of tier_efficiencies():
//   parameters and gradients (Eq. 9): 3/4 of the bytes are parameter fetches (forward, recompute,
//     backward), 1/4 gradients; overlapped with compute by prefetching (Sec. 6.2) when depth > 0,
//     sharing the PCIe link with checkpoint traffic;
//   optimizer states (Eq. 10): after backward, not overlapped (Sec. 4.2); CPU Adam runs alongside
//     the NVMe reads and writes (Sec. 5.2.2), the slower of the two counts;
//   activation checkpoints (Eq. 11): overlapped with compute, on the same PCIe link as parameters;
//   tensor slicing: Megatron's activation all-reduces (6 per layer), not overlapped;
//   --optimizer-overlap backward hides the optimizer behind backward and recompute (3/4 of the
//     computation), dpu behind the whole forward and backward (the refresh then follows them);
//   seed 004's what-ifs: 1-bit Adam sends data-parallel gradients at 1 bit per element
//     (onebit_bytes); attention density changes only memory here (AWM, the score allocation),
//     since Eq. 7 leaves attention FLOPs out (the schedule and the simulator count them).
//   gradient accumulation (config.grad_accum): forward and backward with their traffic that many
//     times, the optimizer once; whole-gradient all-reduces only in the last micro-step. The fields
//     below are per optimizer step (all micro-steps together).
//   pipeline stages (config.pp): a GPU computes 1/pp of each micro-step, sends its activations and
//     their gradients to the neighbour stages (exposed), and 1F1B idles pp - 1 micro-steps' time.
struct TimeBreakdown {
  double compute_s = 0;
  double param_grad_s = 0;   // traffic time, before overlap
  double collective_latency_s = 0;  // of param_grad_s, the data-parallel all-gathers' and reduce-scatters'
                                    // ring step latencies (each parameter group's, whatever its bytes)
  double act_ckpt_s = 0;     // traffic time, before overlap
  double act_ckpt_load_s = 0;  // of act_ckpt_s, the loads back to the GPU: exposed (each waits for its recompute)
  double optimizer_s = 0;    // exposed
  double refresh_s = 0;      // updated fp16 parameters back to GPU-resident copies (ZeRO-Offload), behind the optimizer
  double param_gather_s = 0; // ZeRO-1/2 on the GPU: the updated shards all-gathered after the step, exposed
  double mp_allreduce_s = 0; // exposed
  double all_to_all_s = 0;   // expert parallelism: the tokens' all-to-alls, exposed
  double p2p_s = 0;          // pipeline stages: activations and their gradients between stages, exposed
  double bubble_s = 0;       // pipeline stages: 1F1B's idle pp - 1 micro-steps ((pp-1)/(m+pp-1) of the passes)
  double grad_norm_s = 0;    // gradient clipping: one pass over this rank's gradient partition before any
                             // update (HBM or CPU memory; on NVMe summed as they were written), exposed
  double exposed_s = 0;      // everything added to compute
  double iteration_s = 0;
  double tflops_per_gpu = 0;  // Eq. 7-8 FLOPs per GPU / iteration time
  double samples_per_s = 0;   // bsz x dp / iteration time
};

// What estimate_time reads of a model and profile that no candidate changes: the parameter counts
// (all, and those a token activates), the routed experts' share of a block's weights, the peak at
// this hidden size, a block's active weights (Eq. 11's ait), a rank's parameter units, and one micro-step's compute
// (model/op_cost.hpp's pass_compute, the simulator's cost of each operator) for each micro-batch
// and slicing asked, made on first use and kept (thread-safe). The search makes it once;
// estimate_time(m, c, p) makes it per call.
struct TimeFacts {
  double params = 0, active_params = 0, routed = 1, peak = 0, block_weights = 0;
  static TimeFacts of(const ModelSpec& m, const HardwareProfile& p);
  const PassCompute& pass(const ModelSpec& m, const HardwareProfile& p, const TrainingConfig& c) const;
  // The parameters the optimizer updates on one rank of the fullest pipeline stage: the units the
  // schedule gives it (param_units: tensor-sliced, its stage's blocks), the share that optim32's
  // placement keeps (kept_state_elems: all, or a 1/dp shard, in closed form).
  double optimizer_params(const ModelSpec& m, const Placement& pl, const TrainingConfig& c) const;
  // What one block's prefetch windows leave exposed in its forward, recompute and backward, for
  // the fetch's seconds per parameter element of each hop (nc, cg, gg), the gradient's (offload,
  // reduce-scatter) and a collective's ring latency: made once per micro-batch, slicing, tiling,
  // costs and prefetch depth (the search asks for hundreds of thousands, of a few thousand kinds).
  double block_windows_s(const ModelSpec& m, const HardwareProfile& p, const TrainingConfig& c,
                         const std::array<double, 6>& cost) const;

 private:
  struct Passes;
  std::shared_ptr<Passes> passes_;
};
// The bandwidths of one tier_efficiencies list, by state and tier (0: no such path), looked up
// once per list instead of by name per candidate.
struct TierBandwidths {
  enum Path { gpu, cpu, nvme, cpu_broadcast, kPaths };
  std::array<std::array<double, kPaths>, 3> bps{};  // [AitState][Path]
  static TierBandwidths of(const std::vector<StateTierEfficiency>& eff);
  double of(AitState s, Path path) const { return bps[size_t(s)][size_t(path)]; }
};

// One micro-step's compute on the slowest pipeline stage (all of it without stages) and that
// stage's blocks: what estimate_time counts as compute before gradient accumulation.
struct MicroStep {
  double compute_s = 0;
  int stage_blocks = 0;
};
MicroStep micro_step_compute(const ModelSpec& m, const TrainingConfig& k, const PassCompute& pc);
// estimate_time's compute per sample of the global batch: no candidate with this configuration
// (any placement, overlap or checkpoint tier) takes less time per sample, since everything
// estimate_time adds to the compute is a time no shorter than zero. The search's bound.
double compute_floor_per_sample(const ModelSpec& m, const HardwareProfile& p, const TrainingConfig& k,
                                const TimeFacts& f);
// The same with the config's pass (f.pass(m, p, k)) at hand.
double compute_floor_per_sample(const ModelSpec& m, const TrainingConfig& k, const PassCompute& pc);
// `eff` is tier_efficiencies(p, m, c.config, dp) (cached by the search; recomputed when empty).
TimeBreakdown estimate_time(const ModelSpec& m, const Candidate& c, const HardwareProfile& p,
                            const std::vector<StateTierEfficiency>& eff = {});
// The same with the facts and bandwidths made beforehand (the search's inner loop).
TimeBreakdown estimate_time(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const TimeFacts& f,
                            const TierBandwidths& bw);
// The same for placement `pl` and config `k` under each overlap of `overlaps` (k.optimizer_overlap
// is not read) into `out` (as many): everything but the optimizer's overlap is the same for all of
// them and made once. The search's bound: false, `out` untouched, when every overlap's time per
// sample of the global batch exceeds `bound` before the prefetch windows are made (they only add
// to it). `pass`: f.pass(m, p, k), where the caller holds it.
bool estimate_times(const ModelSpec& m, const Placement& pl, const TrainingConfig& k, const HardwareProfile& p,
                    const TimeFacts& f, const TierBandwidths& bw, std::span<const OptimizerOverlap> overlaps,
                    std::span<TimeBreakdown> out, double bound = INFINITY, const PassCompute* pass = nullptr);

// Nodes the configuration's dp x mp x pp GPUs span.
int nodes_used(const TrainingConfig& k, const HardwareProfile& p);

}  // namespace memwall::planner
