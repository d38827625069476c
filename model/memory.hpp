// The memory model: the bytes one rank holds on each tier (GPU, its share of CPU memory, its share
// of NVMe) for a model, placement, training config and profile. Persistent model states per tier
// and state; the buffers that come and go (fetched parameters of the prefetch window, gradients on
// their way out, checkpoints, activation working memory, staged NVMe reads, optimizer chunks) and
// the peak they make with them, predicted in closed form from the rules the schedule follows:
//   parameters: a group is fetched `prefetch_depth - 1` groups ahead (`- 2` when its shard is on
//     the GPU and only the all-gather fills the buffer) and released after its last use;
//   gradients: one group's whole gradient is in a buffer from its backward until it is reduced or
//     offloaded; the tied embedding's collects from the LM head's backward to the embedding's;
//   checkpoints: one per segment start (Eq. 3 per checkpoint) and micro-batch in flight, given
//     back when the segment's backward is done; offloaded ones are loaded back one segment at a
//     time;
//   activation working memory: Eq. 5 per block while a block runs forward, over a segment's blocks
//     in its recompute and backward, or one preallocated workspace (MemorySizes::workspace_bytes).
// build_schedule places its persistent states and checks capacities with this model, and its
// walked peak is the reference the prediction is tested against (tests/model/test_memory.cpp); the
// planner's fit, the GUI's memory tab and the executor's admission check read it too.
// Pure functions over value types: thread-safe.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/operator_graph.hpp"
#include "model/placement.hpp"
#include "model/training_config.hpp"

namespace memwall {

constexpr int kTiers = 3;

// What the schedule counts in bytes. The defaults are the paper's (Sec. 3-4): 16-bit parameters and
// gradients, 16 bytes of fp32 optimizer state per parameter (master copy, momentum, variance,
// gradient), 16-bit activations, and activation working memory from Eq. 5 held per block in
// forward and per checkpoint segment in backward. An executor passes what it really allocates, so
// the peaks of its schedule are the bytes it will hold.
struct MemorySizes {
  double param_bytes = 2;       // per parameter of param16 and of grad16
  double optim_bytes = 16;      // per parameter of optim32
  double act_bytes = 2;         // per activation element: a checkpoint is act_bytes·bsz·seq·hd (Eq. 3)
  double workspace_bytes = -1;  // < 0: Eq. 5's working memory; >= 0: one activation workspace of this
                                // many bytes held for the whole iteration (an executor's, preallocated)
  // How an executor lays buffers out in its arenas (the memory plan's offsets and sizes): every
  // buffer in CPU memory starts on and fills whole `host_align_bytes` (O_DIRECT's 4096), every GPU
  // buffer `device_align_bytes`; the parts of an optimizer chunk buffer that go to NVMe on their
  // own each start on a host boundary. 1: bytes as counted.
  double host_align_bytes = 1;
  double device_align_bytes = 1;
  // Of optim_bytes, the fp32 gradient: made from the 16-bit gradient at every step, it takes its room
  // in optim32's tier and in the chunk buffers, but is not state, so the optimizer's NVMe round trip
  // neither reads it back nor writes it out (DeepSpeed's PartitionedOptimizerSwapper swaps out the
  // fp32 parameters, exp_avg and exp_avg_sq only). 0 when optim_bytes has no gradient (an executor's).
  double optim_grad_bytes = 4;

  // What the optimizer's NVMe round trip reads and writes per parameter of optim32: its state.
  double swapped_optim_bytes() const { return optim_bytes - optim_grad_bytes; }
};

// One unit of parameters a rank holds: an operator's parameter group, or one tile of it, named as
// the operator graph names it ("block3.fc1[tile 2]"), with its elements after tensor slicing.
// Pipeline stage `stage` holds its blocks, the embedding on the first stage, the final LayerNorm
// and a copy of the tied embedding on the last. In forward order: the schedule's partition order.
struct ParamUnit {
  std::string name;
  OpRole role = OpRole::embed;  // the operator owning the parameters (embed for the tied LM head's)
  int block = -1;
  int tile = -1;                // -1 untiled
  double elems = 0;
  // One of this rank's routed experts under expert parallelism (TrainingConfig::ep > 1): partitioned
  // over the dp / ep ranks that hold the same experts (CommGroup::edp) instead of over dp.
  bool expert = false;
};
std::vector<ParamUnit> param_units(const ModelSpec& m, const TrainingConfig& c, int stage = 0);
// Elements of an operator's `elems` parameters (`bias` of them biases) that each tensor-slicing rank
// holds (Megatron-LM): a column-parallel linear layer (qkv, fc1, the router) splits weights and
// biases over mp, a row-parallel one (proj, fc2) splits its weights and keeps its bias whole (added
// once, after the all-reduce), norms are whole, the embeddings and an untied head split by
// vocabulary or whole (embedding_mp). The one place param_units, the memory model and the
// schedule take a sliced size from.
double mp_param_elems(OpRole role, bool linear, double elems, double bias, const TrainingConfig& c);
// "block3.fc1[tile 2]": how traces and messages name a unit (the one place "[tile N]" is written).
// "block3.fc1", "block3.fc1[tile 1]"; an expert's units (copies > 1): "block3.fc1[expert 2]", or
// "[expert 2 tile 1]" with memory-centric tiling `tiling` (tile = expert x tiling + its tile).
std::string unit_name(OpRole role, int block, int tile, int copies = 1, int tiling = 1);
// ZeRO-Offload's broadcast variant: each rank owns one contiguous range of whole units of about
// 1/dp of the elements (a unit goes to the rank its middle falls in). Owner rank per unit.
std::vector<int> broadcast_owners(const std::vector<ParamUnit>& units, int dp);

// Elements of the parameters state placement `sp` keeps on rank `rank` of `units`: all, a 1/dp
// shard (1 / (dp / ep) of an expert's unit), or (broadcast fetch) the units the rank owns.
double kept_param_elems(const std::vector<ParamUnit>& units, const Placement& pl, const StatePlacement& sp, int dp,
                        int rank, int ep = 1);
// The same for rank `rank` of stage `stage` (c.dp ranks, c.ep), in closed form without naming the
// units (the broadcast variant visits them): what the memory model and the planner's search use.
double kept_state_elems(const ModelSpec& m, const TrainingConfig& c, int stage, const Placement& pl,
                        const StatePlacement& sp, int rank = 0);

// Expert parallelism (TrainingConfig::ep) against the model and placement: a mixture of experts
// whose routed experts ep divides; not with the broadcast fetch (ZeRO-Offload), nor with whole
// 16-bit parameters beside partitioned optimizer states (ZeRO-1/2's all-gather after the optimizer
// would mix groups); the message names --ep and what to change.
Result<bool> check_expert_parallel(const ModelSpec& m, const Placement& pl, const TrainingConfig& c);
// Of an operator's `copies` (a mixture of experts' routed and shared experts), those this rank
// holds: all, or with expert parallelism its E / ep routed ones and every shared one.
int copies_held(const ModelSpec& m, const TrainingConfig& c, int copies);

// How many ranks share one node's CPU memory, NVMe and pinned budget: the GPUs of a node that the
// dp x mp x pp ranks use.
int ranks_sharing_node(const TrainingConfig& c, const HardwareProfile& p);
// The collective groups of more than one rank that a rank is in (data, tensor and pipeline
// parallel): each holds a communicator with its own device buffers (gpu.reserve.communicator).
int communicators_per_rank(const TrainingConfig& c);
// What the software stack keeps on each GPU of this job (gpu.reserve): context + workspace +
// communicators_per_rank x communicator. The one formula planner, schedule and executor use.
double gpu_reserve_bytes(const TrainingConfig& c, const HardwareProfile& p);
// gpu_reserve_bytes's parts, for a reader: "context 636 MiB + workspace 4 MiB + 2 communicators x
// 128 MiB" (empty when the profile has no gpu.reserve).
std::string describe_gpu_reserve(const TrainingConfig& c, const HardwareProfile& p);
// Each tier's capacity for one rank: one GPU's memory less gpu_reserve_bytes; its share of the
// node's CPU memory and NVMe.
std::array<double, kTiers> capacity_per_rank(const TrainingConfig& c, const HardwareProfile& p);
// A rank's share of the node's pinned budget (cpu.pinned_budget): what its CPU buffers may take.
double pinned_per_rank(const TrainingConfig& c, const HardwareProfile& p);

// Bytes of the persistent model states rank `rank` keeps, [tier][state] (act_ckpt stays 0): every
// state's parameters whole, a 1/dp shard, or (broadcast) the units the rank owns; 1-bit Adam's error
// feedback counts with optim32. `c.dp` is resolved.
std::array<std::array<double, 4>, kTiers> persistent_state_bytes(const ModelSpec& m, const Placement& pl,
                                                                const TrainingConfig& c, int rank = 0,
                                                                const MemorySizes& z = {}, int stage = 0);

struct MemoryPart {
  std::string what;  // "param16 (1/dp shard)", "prefetched parameters (3 groups)", ...
  double bytes = 0;
};

struct TierMemory {
  double capacity_bytes = 0;              // per rank
  std::array<double, 4> persistent{};     // per State
  double peak_bytes = 0;                  // persistent + the buffers of the fullest moment
  std::vector<MemoryPart> parts;          // persistent states, then those buffers; they add up to peak_bytes
  size_t buffer_parts = 0;                // how many of `parts` (the last ones) are buffers
  std::string moment;                     // when that is: "backward of block49.fc2 (segment 50 of 50)"
  bool fits() const { return peak_bytes <= capacity_bytes * (1 + 1e-12); }
};

struct MemoryModel {
  std::array<TierMemory, kTiers> tiers;  // indexed by Tier
  const TierMemory& of(Tier t) const { return tiers[size_t(t)]; }
  // CPU buffers of the fullest CPU moment (staged NVMe reads and writes, optimizer chunks, gradients
  // and parameters on their way between GPU and optimizer): what an executor pins.
  double cpu_buffer_bytes = 0;
};

// `c.dp` resolved (fit_to_profile). For rank `rank` and pipeline stage `stage`.
MemoryModel memory_model(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p,
                         int rank = 0, const MemorySizes& z = {}, int stage = 0);

// Under pipeline stages, the stage that holds the most on each tier, and its memory model (stage 0
// without stages). Stages differ in their blocks (stage_chunks: interleaved, 62 blocks over 8 x 4
// chunks leave stage 1 more blocks than stage 0), the micro-batches in flight (fewer on each later
// stage), the embedding (first) and the head (last). So the candidates are the first, the last,
// and between them the first stage of each layout of chunk sizes: a later stage of the same layout
// holds the same parameters with fewer micro-batches in flight.
struct FullestStages {
  std::array<int, kTiers> stage{};
  std::vector<MemoryModel> models;     // the stages' models that are fullest on some tier (one without stages)
  std::array<size_t, kTiers> which{};  // of models, by tier
  const MemoryModel& of(Tier t) const { return models[which[size_t(t)]]; }
};
FullestStages fullest_stages(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p,
                             int rank = 0, const MemorySizes& z = {});

// The optimizer's chunk size in parameters when its states are on NVMe (three chunk buffers within
// the rank's share of the pinned budget, at least `c.optimizer_chunks` or 16 chunks, a multiple of
// kChunkGranule), or when CPU Adam runs chunk by chunk; `n` is the rank's optimizer partition.
// 0 when the optimizer runs as one piece.
double optimizer_chunk_target(const Placement& pl, const TrainingConfig& c, const HardwareProfile& p, double n,
                              const MemorySizes& z = {});
inline constexpr double kChunkGranule = 4096;
// The optimizer's chunks of at most `target` parameters over rank `rank`'s partition of stage
// `stage`, in partition order: the units (param_units) in forward order, each its shard (or, with
// the broadcast fetch, the units the rank owns). A chunk starts at a unit boundary or a multiple of
// kChunkGranule parameters into a unit, so NVMe reads and writes of any chunk stay aligned.
struct OptimizerChunk {
  double start = 0, params = 0;
};
std::vector<OptimizerChunk> optimizer_chunks(const ModelSpec& m, const Placement& pl, const TrainingConfig& c,
                                             double target, int rank = 0, int stage = 0);
// Bytes per parameter an optimizer chunk buffer holds: the states read from NVMe, the gradient read
// with them, and the updated 16-bit parameters on their way to NVMe.
double optimizer_chunk_bytes_per_param(const Placement& pl, const MemorySizes& z = {});

}  // namespace memwall
