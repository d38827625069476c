// Schedule: the ordered steps of one training iteration (one optimizer step: TrainingConfig::grad_accum
// forward/backward micro-steps, then the update) for one data-parallel rank, with explicit
// dependencies, generated from an operator graph, a placement, a training config and a profile
// (paper Sec. 5-7). It is the contract between sim/ and exec/: both run these steps unchanged and
// need not know which strategy produced them. Also the invariant checker every schedule passes.
// Pure functions over value types: thread-safe.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/memory.hpp"
#include "model/operator_graph.hpp"
#include "model/placement.hpp"
#include "model/training_config.hpp"

namespace memwall {

// p2p: a pipeline stage receives ("recv") or sends ("send") one micro-step's activations (forward)
// or their gradients (backward) from or to its neighbour stage (Step::root).
enum class StepKind { fetch, compute, release, reduce_scatter, allreduce, offload, save_ckpt, load_ckpt, optimizer, p2p };
enum class Phase { forward, recompute, backward, optimizer };
// Where bytes travel: NVMe<->CPU memory, CPU memory<->GPU (PCIe), GPU<->GPU in a node (NVLink),
// between nodes (InfiniBand), or nowhere (a step on one device).
enum class LinkClass { none, nvme_cpu, cpu_gpu, gpu_gpu, network };
constexpr int kLinkClasses = 5;
const char* to_string(StepKind k);
const char* to_string(Phase p);
const char* to_string(LinkClass l);

// A buffer that exists only for part of an iteration: fetched parameters, gradients on their way
// out, staged NVMe reads, checkpoints, activation working memory, optimizer chunks. It is made
// before the step that names it in `allocs` starts and given back once the step that names it in
// `frees` has completed. Persistent model states are not buffers (Schedule::persistent_bytes).
// Names are the contract between the generator and an executor:
//   "<group>[tile t]@<phase>"  fetched 16-bit parameters (Step::param of the fetches and release)
//   "nc:<that>"                the same parameters staged in CPU memory on their way from NVMe
//   "grad:<group>[tile t]"     a gradient being accumulated, reduced and offloaded
//   "gc:<group>[tile t]"       a gradient staged in CPU memory on its way to NVMe
//   "ckpt:block<b>.input[ mb<u>]" / "ckpt@gpu:..."  a checkpoint on its tier / loaded back to the GPU
//   "act:block<b>", "awm:segment<b>", "workspace"   activation working memory (see MemorySizes)
//   "adam[chunk k]"            one optimizer chunk in CPU memory (states, and what travels with them)
//   "grads16", "params16"      every gradient / updated parameter of the rank staged in CPU memory
struct Buffer {
  std::string name;
  Tier tier = Tier::gpu;
  double bytes = 0;
};

struct Step {
  int id = 0;
  StepKind kind = StepKind::compute;
  Phase phase = Phase::forward;
  std::string op;           // operator ("block3.fc1"), or "adam[chunk 4]" for the optimizer
  std::string hop;          // fetch: "nc", "cg", "gg" or "bcast"; offload: "gc", "cn"; else empty
  std::optional<State> state;  // the state a transfer moves (param16, grad16, optim32, act_ckpt)
  std::string param;        // the parameters (tile) a compute needs, or a fetch/release moves
  int tile = -1;            // memory-centric tiling: which tile of the operator, -1 if untiled
  int micro_batch = -1;     // l2l inner loop index, -1 otherwise
  int accum_step = -1;      // gradient accumulation: the forward/backward micro-step, -1 without it
  double bytes = 0;         // bytes this rank moves (received for collectives) or frees
  double flops = 0;         // compute on the GPU
  double params = 0;        // optimizer: parameters updated
  Tier src = Tier::gpu, dst = Tier::gpu;
  LinkClass link = LinkClass::none;
  std::vector<int> deps;    // ids of earlier steps that must finish first
  int root = -1;            // bcast and the owner's reduce: the rank that owns the parameters
                            // (ZeRO-Offload: each rank owns one contiguous range of whole units)
  std::string src_buf;      // the buffer a transfer reads or a compute takes its weights from;
                            // empty: the persistent `state` (this rank's shard) on `src`
  std::string dst_buf;      // the buffer a transfer writes or a backward compute accumulates its
                            // gradient into; empty: the persistent `state` on `dst`
  std::vector<Buffer> allocs;      // made before this step starts
  std::vector<std::string> frees;  // given back when this step has completed
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
  std::vector<Step> steps;
  std::array<double, kTiers> capacity_bytes{};  // per rank: one GPU; its share of CPU memory / NVMe
  std::array<double, kTiers> peak_bytes{};      // per rank, indexed by Tier
  // Per rank, [Tier][State]: the model states placed before the first step (act_ckpt stays 0;
  // checkpoints, fetched parameters and buffers come and go and are only in peak_bytes).
  std::array<std::array<double, 4>, kTiers> persistent_bytes{};
  std::array<double, kLinkClasses> traffic_bytes{};  // per rank, indexed by LinkClass
  std::optional<Overflow> overflow;             // first tier that would exceed its capacity
  double compute_flops = 0;                     // GPU FLOPs of this rank per iteration
  MemorySizes sizes;                            // what it was built with
  OptimizerOverlap optimizer_overlap = OptimizerOverlap::none;  // when the CPU optimizer runs
  // The optimizer's chunks over this rank's partition of the parameters (the memory model's
  // optimizer_chunks): one unless optim32 is on NVMe or CPU Adam runs chunk by chunk.
  using Chunk = OptimizerChunk;
  std::vector<Chunk> optimizer_chunks;
  double optimizer_chunk_params = 0;            // the largest chunk
};

// Bytes of buffers (not persistent states) alive on `tier` once step `step` has started, walking
// the steps in order: what `peak_bytes` is the maximum of, plus the persistent states.
std::vector<double> buffer_bytes_by_step(const Schedule& s, Tier tier);

// Whether a placement allows running the CPU optimizer as `ov` says; the error names the flag and
// says why (the generator and the planner both ask here).
Result<bool> check_optimizer_overlap(const Placement& placement, OptimizerOverlap ov);

// `rank` in [0, dp), `stage` in [0, pp). Fails only on inconsistent input (dp x mp x pp larger than
// the profile, ...). A schedule that does not fit is returned with `overflow` set: that is a
// result, not an error. With pp > 1 the stage holds its blocks' parameters (the first also the
// embedding, the last the final LayerNorm, the LM head and a copy of the tied embedding) and runs
// config.grad_accum micro-steps 1F1B, receiving and sending activations and their gradients (p2p).
Result<Schedule> build_schedule(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                const HardwareProfile& profile, int rank = 0, const MemorySizes& sizes = {},
                                int stage = 0);

// Invariants: deps point backwards (no cycles); every compute finds its parameters resident; every
// fetched parameter is released after its last use; every transfer has a source, a destination and
// bytes; every buffer is made once and given back once, by the same step or a later one, and the
// buffers a step reads exist when it starts; the optimizer overlap's rules: a CPU update waits for
// something (backward: its gradients), dpu's updates all come before the first compute and its
// parameter copies to the GPU after the last. Empty when all hold.
std::vector<std::string> check_invariants(const Schedule& s);

// One line per step, for humans and golden files.
std::string schedule_text(const Schedule& s);

}  // namespace memwall
