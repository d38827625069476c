// Step: one unit of work of a schedule (model/schedule.hpp), typed. Kind, phase, hop, link and
// collective are enums; the parameters, buffers, optimizer chunk and operator a step touches are
// integer ids into the tables the Schedule owns (units, buffers, optimizer_chunks, ops). `name` is
// for display and traces only: nothing outside the generator reads meaning from it.
// Also the one classifier of a step: the resource it occupies (step_resource), whether it talks to
// other ranks (is_collective) and, beside its `link` field, its label (step_label). Adding a step
// kind: the enum and these functions here, the generator's phase that emits it, one handler in
// sim/handlers.cpp and one in exec/engine/handlers.cpp (docs/ARCHITECTURE.md, "Adding a step kind").
// Value types and pure functions: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/placement.hpp"

namespace memwall {

// p2p: a pipeline stage receives or sends one micro-step's activations (forward) or their
// gradients (backward) from or to its neighbour stage (CollectiveSpec::root).
// accumulate: gradient accumulation adds this micro-step's gradient (src_buf, this rank's part, on
// `src`) into the sum of the earlier micro-steps (dst_buf, or the persistent grad16 on `dst`):
// partitioned or offloaded gradients leave the GPU's buffer in every micro-step.
// all_to_all: a mixture of experts' token exchange over the expert-parallel group (TrainingConfig::ep):
// each rank sends every other member the tokens routed to its experts (dispatch, before the experts)
// and gets their outputs back (combine, after), and the same for the gradients in backward.
// grad_norm: gradient clipping (TrainingConfig::grad_clip). Without a collective spec, this rank's
// sum of squares over the gradients of its optimizer partition, where they are (`src`: a pass over
// `bytes` of HBM or CPU memory; gradients on NVMe were summed from the pinned buffer as each final
// one was written, so nothing is left to read); with one (all_gather over dp), every rank's sum to
// every rank, each then adding them in rank order: the same norm, bit for bit, on every rank.
enum class StepKind : std::uint8_t {
  fetch, compute, release, reduce_scatter, allreduce, offload, save_ckpt, load_ckpt, optimizer, p2p, accumulate,
  all_to_all, grad_norm
};
inline constexpr int kStepKinds = 13;
enum class Phase : std::uint8_t { forward, recompute, backward, optimizer };
// Where bytes travel: NVMe<->CPU memory, CPU memory<->GPU (PCIe), GPU<->GPU in a node (NVLink),
// between nodes (InfiniBand), or nowhere (a step on one device).
enum class LinkClass : std::uint8_t { none, nvme_cpu, cpu_gpu, gpu_gpu, network };
inline constexpr int kLinkClasses = 5;

// The hop a transfer makes (Sec. 6.2's names): fetch nc (NVMe -> CPU), cg (CPU -> GPU), gg
// (all-gather over the data-parallel group), bcast (the owner's broadcast), mp (all-gather of a
// partitioned checkpoint over the tensor-slicing group); offload gc (GPU -> CPU), cn (CPU -> NVMe);
// a checkpoint saved gc or loaded cg when it lives in CPU memory; reduce_scatter rs (or reduce to
// the owner); allreduce ar (gradients) or mp (Megatron's activations); p2p send or recv.
enum class Hop : std::uint8_t { none, nc, cg, gg, bcast, mp, gc, cn, rs, reduce, ar, send, recv, a2a };

// A step that talks to other ranks carries what every member must agree on.
enum class CollectiveKind : std::uint8_t {
  none, all_gather, broadcast, reduce_scatter, reduce, all_reduce, send, recv, all_to_all
};
// ep: the expert-parallel group (ep consecutive data-parallel ranks, whose experts differ); edp: the
// expert data-parallel group (the dp / ep ranks holding the same experts), over which an expert's
// parameters are partitioned and its gradients reduced. tied: the first and the last pipeline
// stage's ranks of one dp rank and slice, which hold the tied embedding's two copies (pp > 1).
enum class CommGroup : std::uint8_t { dp, mp, pp, ep, edp, tied };
inline constexpr int kCommGroups = 6;
struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::none;
  CommGroup group = CommGroup::dp;
  int members = 1;   // ranks of the group
  int root = -1;     // broadcast / reduce: the member that owns the buffer; send / recv: the other stage
  // Each member's part: all_gather's shard, reduce_scatter's output shard, the whole buffer of an
  // all_reduce, broadcast or reduce, a p2p message, an all_to_all's send buffer (1/members of it to
  // each member, itself included). What moves on the wire (1-bit Adam compresses
  // gradient collectives) rather than the buffer's size.
  double bytes_per_rank = 0;
  // The whole buffer of the operation (all_gather's output, reduce_scatter's input, ...).
  double whole_bytes() const {
    return kind == CollectiveKind::all_gather || kind == CollectiveKind::reduce_scatter ? bytes_per_rank * members
                                                                                        : bytes_per_rank;
  }
};

struct Step {
  int id = 0;
  StepKind kind = StepKind::compute;
  Phase phase = Phase::forward;
  Hop hop = Hop::none;
  std::optional<State> state;  // the state a transfer moves (param16, grad16, optim32, act_ckpt)
  std::string name;            // display: "block3.fc1[tile 1]", "adam[chunk 4]", "block2.input"
  int op = -1;          // compute: Schedule::ops
  int unit = -1;        // Schedule::units: the parameters a fetch moves, a compute uses, a release
                        // frees, or the gradient a reduce or offload moves
  int chunk = -1;       // Schedule::optimizer_chunks: an optimizer-phase step's chunk
  int block = -1;       // checkpoints and p2p: the block whose input they carry
  int tile = -1;        // memory-centric tiling: which tile of the operator, -1 if untiled
  int micro_batch = -1; // l2l inner loop index, -1 otherwise
  int accum_step = -1;  // gradient accumulation: the forward/backward micro-step, -1 without it
  double bytes = 0;     // bytes this rank moves (received for collectives) or frees
  double flops = 0;     // compute on the GPU
  double params = 0;    // optimizer: parameters updated
  Tier src = Tier::gpu, dst = Tier::gpu;
  LinkClass link = LinkClass::none;
  CollectiveSpec collective;  // kind none unless the step talks to other ranks
  std::vector<int> deps;      // ids of earlier steps that must finish first
  // Schedule::buffers ids. src_buf: what a transfer reads or a compute takes its weights from;
  // dst_buf: what a transfer writes or a backward compute accumulates its gradient into; -1: the
  // persistent `state` (this rank's part) on `src` / `dst`.
  int src_buf = -1, dst_buf = -1;
  std::vector<int> uses;    // other buffers it reads or writes (the optimizer's staged gradients and parameters)
  std::vector<int> allocs;  // buffers made before this step starts
  std::vector<int> frees;   // buffers given back once this step has completed
};

constexpr const char* to_string(StepKind k) {
  switch (k) {
    case StepKind::fetch: return "fetch";
    case StepKind::compute: return "compute";
    case StepKind::release: return "release";
    case StepKind::reduce_scatter: return "reduce_scatter";
    case StepKind::allreduce: return "allreduce";
    case StepKind::offload: return "offload";
    case StepKind::save_ckpt: return "save_ckpt";
    case StepKind::load_ckpt: return "load_ckpt";
    case StepKind::optimizer: return "optimizer";
    case StepKind::p2p: return "p2p";
    case StepKind::accumulate: return "accumulate";
    case StepKind::all_to_all: return "all_to_all";
    case StepKind::grad_norm: return "grad_norm";
  }
  return "?";
}
constexpr const char* to_string(Phase p) {
  switch (p) {
    case Phase::forward: return "fwd";
    case Phase::recompute: return "recompute";
    case Phase::backward: return "bwd";
    case Phase::optimizer: return "optim";
  }
  return "?";
}
constexpr const char* to_string(LinkClass l) {
  switch (l) {
    case LinkClass::none: return "none";
    case LinkClass::nvme_cpu: return "nvme_cpu";
    case LinkClass::cpu_gpu: return "cpu_gpu";
    case LinkClass::gpu_gpu: return "gpu_gpu";
    case LinkClass::network: return "network";
  }
  return "?";
}
constexpr const char* to_string(Hop h) {
  switch (h) {
    case Hop::none: return "";
    case Hop::nc: return "nc";
    case Hop::cg: return "cg";
    case Hop::gg: return "gg";
    case Hop::bcast: return "bcast";
    case Hop::mp: return "mp";
    case Hop::gc: return "gc";
    case Hop::cn: return "cn";
    case Hop::rs: return "rs";
    case Hop::reduce: return "reduce";
    case Hop::ar: return "ar";
    case Hop::send: return "send";
    case Hop::recv: return "recv";
    case Hop::a2a: return "a2a";
  }
  return "?";
}
constexpr const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::none: return "none";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::reduce: return "reduce";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
    case CollectiveKind::all_to_all: return "all_to_all";
  }
  return "?";
}
constexpr const char* to_string(CommGroup g) {
  switch (g) {
    case CommGroup::dp: return "dp";
    case CommGroup::mp: return "mp";
    case CommGroup::pp: return "pp";
    case CommGroup::ep: return "ep";
    case CommGroup::edp: return "edp";
    case CommGroup::tied: return "tied";
  }
  return "?";
}

// Whether the step talks to other ranks: every member must issue it, in the same order.
inline bool is_collective(const Step& s) { return s.collective.kind != CollectiveKind::none; }
// A pipeline stage's send or receive (one peer), as opposed to a group collective.
inline bool is_p2p(const Step& s) {
  return s.collective.kind == CollectiveKind::send || s.collective.kind == CollectiveKind::recv;
}

// The resource a step occupies: "gpu_compute", "cpu" (CPU Adam, a gradient summed in CPU memory), "pcie", "nvme", "nvlink",
// "network", or "" for bookkeeping that occupies nothing (release, a checkpoint kept on the GPU).
inline const char* step_resource(const Step& s) {
  switch (s.kind) {
    case StepKind::compute: return "gpu_compute";
    case StepKind::optimizer:
    case StepKind::accumulate: return s.src == Tier::cpu ? "cpu" : "gpu_compute";
    case StepKind::grad_norm:
      if (!is_collective(s)) return s.bytes <= 0 ? "" : s.src == Tier::cpu ? "cpu" : "gpu_compute";
      break;
    case StepKind::release: return "";
    default: break;
  }
  if (s.bytes <= 0) return "";
  switch (s.link) {
    case LinkClass::none: return "";
    case LinkClass::nvme_cpu: return "nvme";
    case LinkClass::cpu_gpu: return "pcie";
    case LinkClass::gpu_gpu: return "nvlink";
    case LinkClass::network: return "network";
  }
  return "";
}

// "fetch.nc block3.fc1", "compute block3.fc1", "optimizer adam[chunk 2]": what traces call a step.
inline std::string step_label(const Step& s) {
  std::string n = to_string(s.kind);
  if (s.hop != Hop::none) n += std::string(".") + to_string(s.hop);
  return n + " " + s.name;
}

}  // namespace memwall
