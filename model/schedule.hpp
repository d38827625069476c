// Schedule: the ordered steps of one training iteration (one optimizer step: TrainingConfig::grad_accum
// forward/backward micro-steps, then the update) for one data-parallel rank, with explicit
// dependencies, generated from an operator graph, a placement, a training config and a profile
// (paper Sec. 5-7). It is the contract between sim/ and exec/: both run these steps unchanged and
// need not know which strategy produced them. Also the invariant checker every schedule passes.
// Pure functions over value types: thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/memory.hpp"
#include "model/operator_graph.hpp"
#include "model/placement.hpp"
#include "model/step.hpp"
#include "model/training_config.hpp"

namespace memwall {

// An operator the schedule computes: what a consumer needs to run it (role, block) or cost it.
struct ScheduleOp {
  std::string name;  // "block3.fc1"
  OpKind kind = OpKind::linear;
  OpRole role = OpRole::embed;
  int block = -1;
  int copies = 1;  // experts of a mixture of experts' fc1 / fc2, each its own units (tiles)
  double fwd_flops = 0, bwd_flops = 0;  // the whole operator, before tensor slicing and tiling
  double act_bytes = 0;  // activations read + written in forward, at the schedule's act_bytes
};

// One unit of parameters the rank's stage holds (param_units: a parameter group or a tile of it,
// in forward order, which is the partition order), and the rank's part of it: elements
// [from, from + len) of the unit, a 1/dp shard at from = rank * shard (bandwidth-centric), or all
// of it or nothing (the broadcast variant: the units the rank owns). A state kept whole lays the
// units out one after another (whole_at); a partitioned one keeps the rank's parts (part_at). The
// one unit and shard layout: the schedule's bytes, the optimizer's chunks and an executor's tiers
// all use it.
struct ScheduleUnit : ParamUnit {
  double shard = 0;  // elems / dp: what each rank contributes to the unit's all-gather
  int root = -1;     // broadcast fetch: the rank that owns (reads, updates and broadcasts) it
  double from = 0, len = 0;
  double whole_at = 0, part_at = 0;
};

// Part of a unit's optimizer slice (its part when optim32 is partitioned, else all of it) inside
// one optimizer chunk.
struct ChunkPiece {
  int unit = 0;
  double from = 0, count = 0;  // elements into the slice
};
// An optimizer chunk (start and params over the rank's optimizer partition) with the pieces it
// covers and the layout of its buffer in CPU memory: the states read from NVMe first, then each
// piece's gradient read from NVMe, then each piece's updated 16-bit parameters on their way to
// NVMe, every part starting on MemorySizes::host_align_bytes (so it goes to the drive as it is).
struct ScheduleChunk : OptimizerChunk {
  std::vector<ChunkPiece> pieces;
  std::vector<double> grad_at, param_at;  // byte offsets in the buffer, per piece (empty: not in it)
  double layout_bytes = 0;
};

// What a buffer holds; an executor treats some kinds specially (a gradient buffer starts at zero).
enum class BufferKind : std::uint8_t {
  params,         // fetched 16-bit parameters of a unit, whole, on the GPU
  staged_params,  // the same parameters in CPU memory on their way from NVMe (nc -> cg)
  grad,           // a unit's gradient being accumulated, reduced and offloaded, on the GPU
  staged_grad,    // a gradient in CPU memory on its way to NVMe (gc -> cn)
  ckpt,           // an activation checkpoint on its tier
  ckpt_loaded,    // a checkpoint in CPU memory loaded back to the GPU for its segment's recompute
  ckpt_whole,     // a partitioned checkpoint all-gathered whole over the tensor-slicing group
  activations,    // one block's activations while it runs forward (Eq. 5 per block)
  awm,            // a checkpoint segment's activation working memory in backward (Eq. 5)
  workspace,      // an executor's preallocated activation workspace, the whole iteration
  chunk,          // one optimizer chunk in CPU memory (ScheduleChunk's layout)
  grads16,        // every gradient of the rank staged in CPU memory for the CPU optimizer
  params16,       // a chunk's updated 16-bit parameters staged in CPU memory for the GPU
};
const char* to_string(BufferKind k);

// A buffer that exists only for part of an iteration. It is made before the step that names it
// in `allocs` starts (made_at) and given back once the step that names it in `frees` (freed_at)
// has completed; every step that reads or writes it depends on made_at, directly or not, and
// freed_at on every one of them. Persistent model states are not buffers (persistent_bytes).
// The memory plan (model/memory_plan.hpp) gives it a place: `offset` in its tier's arena, bytes
// [offset, offset + arena_bytes), shared with no buffer alive at the same time in any order the
// dependencies allow.
struct Buffer {
  std::string name;  // display: "block3.fc1@fwd", "nc:...", "grad:...", "ckpt:block2.input", "adam[chunk 4]"
  BufferKind kind = BufferKind::params;
  Tier tier = Tier::gpu;
  double bytes = 0;       // what it holds (the memory model counts this)
  int unit = -1;          // params, staged_params, grad, staged_grad: Schedule::units
  int chunk = -1;         // chunk, params16: Schedule::optimizer_chunks
  int made_at = -1, freed_at = -1;
  std::uint64_t arena_bytes = 0;  // as laid out: rounded to the tier's alignment (a chunk buffer:
                                  // the largest chunk's layout, so chunk buffers are equal slots)
  std::uint64_t offset = 0;       // the plan's place in the tier's buffer arena
};

struct Overflow {
  Tier tier;
  int step;  // first step at which the tier's capacity is exceeded
  double needed_bytes;
  double capacity_bytes;
  std::string message;
};

struct Schedule {
  std::string strategy;
  int rank = 0, dp = 1, mp = 1, micro_batches = 1;
  int grad_accum = 1;  // forward/backward micro-steps before the one optimizer step
  int pp = 1, stage = 0;  // pipeline stages, and the one this schedule runs (its blocks: stage_blocks)
  // What it was built from (config.dp resolved), so a consumer needs only the schedule and a profile.
  ModelSpec model;
  Placement placement;
  TrainingConfig config;
  bool broadcast = false;  // the broadcast fetch with dp > 1: units have owners (ScheduleUnit::root)
  std::vector<Step> steps;
  std::vector<ScheduleOp> ops;        // Step::op
  std::vector<ScheduleUnit> units;    // Step::unit, Buffer::unit
  std::vector<Buffer> buffers;        // Step::allocs, frees, src_buf, dst_buf
  // The optimizer's chunks over this rank's partition of the parameters (the memory model's
  // optimizer_chunks): one unless optim32 is off the GPU and runs in chunks.
  std::vector<ScheduleChunk> optimizer_chunks;
  double optimizer_chunk_params = 0;  // the largest chunk
  std::array<double, kTiers> capacity_bytes{};  // per rank: one GPU; its share of CPU memory / NVMe
  std::array<double, kTiers> peak_bytes{};      // per rank, indexed by Tier: persistent + live buffers
  // Per rank, [Tier][State]: the model states placed before the first step (act_ckpt stays 0;
  // checkpoints, fetched parameters and buffers come and go and are only in peak_bytes).
  std::array<std::array<double, 4>, kTiers> persistent_bytes{};
  // The memory plan: bytes of each tier's buffer arena (the highest end of any buffer's range),
  // what an executor reserves beside the persistent states; >= the live buffers' peak.
  std::array<std::uint64_t, kTiers> arena_bytes{};
  int memory_edges = 0;  // dependencies the plan added: a buffer reusing bytes waits for their last user
  std::array<double, kLinkClasses> traffic_bytes{};  // per rank, indexed by LinkClass
  std::optional<Overflow> overflow;             // first tier that would exceed its capacity
  double compute_flops = 0;                     // GPU FLOPs of this rank per iteration
  MemorySizes sizes;                            // what it was built with
  OptimizerOverlap optimizer_overlap = OptimizerOverlap::none;  // when the CPU optimizer runs
};

// Whether a placement allows running the CPU optimizer as `ov` says, with gradients clipped at
// `grad_clip` (0: not clipped; TrainingConfig::grad_clip); the error names the flag and says why
// (the generator and the planner both ask here).
Result<bool> check_optimizer_overlap(const Placement& placement, OptimizerOverlap ov, double grad_clip);

// `rank` in [0, dp), `stage` in [0, pp). Fails only on inconsistent input (dp x mp x pp larger than
// the profile, ...). A schedule that does not fit is returned with `overflow` set: that is a
// result, not an error. With pp > 1 the stage holds its blocks' parameters (the first also the
// embedding, the last the final LayerNorm, the LM head and a copy of the tied embedding) and runs
// config.grad_accum micro-steps 1F1B, receiving and sending activations and their gradients (p2p).
Result<Schedule> build_schedule(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                const HardwareProfile& profile, int rank = 0, const MemorySizes& sizes = {},
                                int stage = 0);

// The schedules a replay of the whole job needs, as built: one per rank for the broadcast variant
// (its ranks differ), one per pipeline stage (each the same for its dp ranks), else rank 0's (every
// rank alike). Stops after the first that overflows. With pipeline stages all of them are held at
// once, as large as the whole model's (checked against this machine's memory).
Result<std::vector<Schedule>> build_schedules(const ModelSpec& model, const Placement& placement,
                                              const TrainingConfig& config, const HardwareProfile& profile,
                                              const MemorySizes& sizes = {});

// Invariants: deps point backwards (no cycles); every compute finds its parameters resident; every
// fetched parameter is released after its last use; every transfer has a source, a destination and
// bytes; every buffer is made once and given back once, by the same step or a later one, and the
// buffers a step reads exist when it starts; the optimizer overlap's rules: a CPU update waits for
// something (backward: its gradients), dpu's updates all come before the first compute and its
// parameter copies to the GPU after the last. Empty when all hold.
std::vector<std::string> check_invariants(const Schedule& s);

// A header line, then one line per step, for humans and golden files.
std::string schedule_text(const Schedule& s);

}  // namespace memwall
