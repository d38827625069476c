// The schedule generator's insides (model/ only): what every phase reads (Shape), the one writer
// of the schedule being built (Emitter), and the state each flow carries between phases (the
// compute chain, gradients on their way out, checkpoints, the optimizer's chunks), bundled in the
// Builder every phase takes. The phases live in schedule_{fetch,forward,backward,optimizer,
// pipeline}.cpp; build_schedule (schedule.cpp) runs them in order. Single-threaded.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/op_cost.hpp"
#include "model/schedule.hpp"

namespace memwall::build {

// One unit of work in a phase: an operator (or one tile of it) for one micro-batch.
struct Item {
  size_t v;
  int tile;
  int u;
  Phase phase = Phase::forward;
};

// What a schedule is built from and what follows from it; read-only while steps are emitted.
struct Shape {
  Shape(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p, int rank, int dp,
        const MemorySizes& sizes, int stage);

  const ModelSpec& m;
  const Placement& pl;
  const TrainingConfig& c;
  const HardwareProfile& p;
  int rank, dp, stage, pp, micro_batches, grad_accum;
  int v;  // chunks per stage (interleaved 1F1B's virtual stages; 1: plain 1F1B)
  MemorySizes z;
  OperatorGraph g;
  std::vector<StageBlocks> chunks;  // this stage's blocks, chunk by chunk (stage_chunks)
  // A collective inside a node uses NVLink/NVSwitch; one spanning nodes is limited by the network.
  LinkClass collective_link = LinkClass::gpu_gpu;
  // to the stage before / after (interleaved: the first stage's before is the last, and back)
  LinkClass p2p_prev = LinkClass::none, p2p_next = LinkClass::none;
  LinkClass tied_link = LinkClass::none;  // between the first and the last stage (the tied embedding's copies)
  std::vector<size_t> owner;  // per vertex: the operator whose parameters it uses (SIZE_MAX: none)
  std::vector<int> op_index;  // per vertex: Schedule::ops
  std::vector<ScheduleOp> ops;
  std::vector<ScheduleUnit> units;              // this rank's stage, in forward (partition) order
  std::map<std::pair<size_t, int>, int> unit_of;  // (owner vertex, tile) -> units
  std::vector<size_t> head_ops, tail_ops;       // the embedding; ln_f and lm_head (this stage's)
  std::vector<std::vector<size_t>> ops_of_block;  // per transformer block: its operators in graph order

  // A linear layer's tiles (memory-centric tiling), of each expert this rank holds (a mixture of
  // experts' fc1 and fc2 fetch, compute and offload one expert at a time, each its own units; with
  // expert parallelism its E / ep routed experts and the shared ones).
  int tiles(size_t v) const {
    return (c.tiling_factor > 1 && g.op(v).kind == OpKind::linear ? c.tiling_factor : 1) *
           copies_held(m, c, g.op(v).copies);
  }
  // The ranks a unit is partitioned over and gathered and reduced in: the data-parallel group, or
  // for a routed expert under expert parallelism the dp / ep ranks that hold it (CommGroup::edp).
  int unit_ranks(const ScheduleUnit& u) const { return u.expert ? dp / std::max(1, c.ep) : dp; }
  CommGroup unit_group(const ScheduleUnit& u) const { return u.expert ? CommGroup::edp : CommGroup::dp; }
  int unit_rank(const ScheduleUnit& u) const { return u.expert ? rank / std::max(1, c.ep) : rank; }
  bool tiled(size_t v) const { return tiles(v) > 1; }
  // Tensor slicing divides every operator's work but LayerNorm's (replicated, tiny) across mp
  // ranks; the embedding and LM head's only when they are split by vocabulary (embedding_mp).
  double mp_share(size_t v) const { return mp_flops_share(g.op(v).kind, g.op(v).role, c); }
  // The parameters of (the owner of) operator o one tensor-slicing rank holds (mp_param_elems).
  double mp_params(size_t o) const {
    const Operator& op = g.op(o);
    return mp_param_elems(op.role, op.kind == OpKind::linear, op.param_elems, op.param_elems - op.weight_elems, c);
  }
  bool has_params(size_t v) const { return owner[v] != SIZE_MAX; }
  // 16-bit bytes of the parameters a (tile of an) operator needs on this rank, whole (not sharded).
  double param_bytes(size_t v) const {
    const size_t o = owner[v];
    const Operator& op = g.op(o);
    if (op.copies > 1)  // one expert's tile, whichever experts this rank holds
      return z.param_bytes * mp_params(o) / (op.copies * std::max(1, c.tiling_factor));
    return z.param_bytes * mp_params(o) / tiles(o);
  }
  int unit(const Item& it) const { return unit_of.at({owner[it.v], it.tile}); }
  // A tied embedding under pipeline stages has a copy on the first stage (the embedding's) and on
  // the last (the LM head's): its gradient collects over every micro-step on the GPU and the two
  // copies' sums are all-reduced (CommGroup::tied) before it is reduced over dp, as Megatron-LM
  // does, so both stages update their copy alike.
  bool collects_across_stages(const ScheduleUnit& u) const {
    return pp > 1 && m.tied_embeddings && u.role == OpRole::embed;
  }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
  // Chunk k holds the embedding (the pipeline's first virtual stage) or the head (its last).
  bool starts_pipeline(int k) const { return first_stage() && k == 0; }
  bool ends_pipeline(int k) const { return last_stage() && k == v - 1; }
  int prev_stage() const { return (stage + pp - 1) % pp; }
  int next_stage() const { return (stage + 1) % pp; }
  // Pipeline stages: the operators this stage computes (its blocks; the embedding on the first,
  // the final LayerNorm and LM head on the last).
  bool computes(size_t v) const;
  bool workspace() const { return z.workspace_bytes >= 0; }
  bool broadcast() const { return pl.fetch == ParamFetch::broadcast && dp > 1; }
  bool param_resident_always() const { return pl.param16.tier == Tier::gpu && !pl.param16.partitioned; }
  // A backward compute accumulates its gradient into a buffer of its own when a later step
  // reduces or offloads it, otherwise into the persistent grad16 on the GPU.
  bool grad_has_buffer() const {
    return pl.grad16.tier != Tier::gpu || (pl.grad16.partitioned && dp > 1);
  }
  double act_elems() const { return c.bsz * double(c.seq) * double(m.hidden); }
  double ckpt_bytes() const { return z.act_bytes * act_elems(); }
  // act_ckpt partitioned (DeepSpeed's partition_activations): each tensor-slicing rank keeps 1/mp
  // of a checkpoint and the slices are all-gathered over the mp group before the recompute.
  bool ckpt_gathered() const { return pl.act_ckpt.partitioned && c.mp > 1; }
  double kept_ckpt_bytes() const { return ckpt_bytes() / (ckpt_gathered() ? c.mp : 1); }
  // Block b's operators in graph order (indexed once: a scan per block made schedules quadratic in layers).
  const std::vector<size_t>& block_ops(int b) const { return ops_of_block[size_t(b)]; }
  // Items of `ops` in order (reversed in backward). l2l's micro-batch loop is the outer one (seed 002, Sec. 2.2: a layer's parameters arrive once,
  // then every micro-batch runs through it): the lists of `phases` (a segment's recompute, then its
  // backward) for micro-batch 0, then for 1, ...; a tiled operator's tiles inside each.
  std::vector<Item> items_of(const std::vector<size_t>& ops, Phase ph) const { return items_of({{&ops, ph}}); }
  std::vector<Item> items_of(const std::vector<std::pair<const std::vector<size_t>*, Phase>>& phases) const;
};

// Appends steps and buffers: the only writer of the schedule while it is built.
class Emitter {
 public:
  Emitter(Schedule& s, const Shape& sh) : s_(s), sh_(sh) {}
  int emit(Step st);
  Step& step(int id) { return s_.steps[size_t(id)]; }
  int last_step() const { return int(s_.steps.size()) - 1; }
  // A new buffer (not yet made by any step).
  int buffer(BufferKind kind, std::string name, Tier tier, double bytes, int unit = -1, int chunk = -1);
  // A new buffer made by `step`.
  int alloc(int step, BufferKind kind, std::string name, Tier tier, double bytes, int unit = -1, int chunk = -1);
  void free_at(int step, int buf) { s_.steps[size_t(step)].frees.push_back(buf); }
  const Buffer& buf(int id) const { return s_.buffers[size_t(id)]; }
  const Schedule& schedule() const { return s_; }
  Schedule& schedule() { return s_; }
  int accum = -1;  // the micro-step being emitted; -1 before and after them
  // sync_fetches: the rank's device work emitted since the last synchronize (every step but NVMe
  // reads and writes, work on the CPU and pipeline messages); a fetch takes them as dependencies.
  std::vector<int> take_device_work() { return std::exchange(device_work_, {}); }
  // sync_fetches: the fetches to the GPU emitted since the last compute, which the next compute
  // waits for (DeepSpeed's per-module synchronize waits for every all-gather in flight, prefetched
  // ones included).
  std::vector<int> take_fetches() { return std::exchange(fetches_, {}); }

 private:
  Schedule& s_;
  const Shape& sh_;
  std::vector<int> device_work_, fetches_;
};

// A transfer step: the fields every transfer sets, the rest left default.
struct Transfer {
  StepKind kind;
  Phase phase;
  Hop hop;
  State state;
  double bytes;
  Tier src, dst;
  LinkClass link;
};
Step transfer(const Transfer& t, std::string name, std::vector<int> deps, int src_buf = -1, int dst_buf = -1);
// Step ids >= 0 of `ids`.
std::vector<int> deps(std::initializer_list<int> ids);
LinkClass link_between(Tier a, Tier b);

// Computes run in order; the fetches for one are issued when the compute before the previous one
// finishes (prefetch), and what a compute waits for or makes is collected before it is emitted.
struct Chain {
  int last = -1;  // the latest compute (or Megatron all-reduce)
  int prev = -1;  // the compute before it
  std::vector<int> next_deps;    // checkpoint loads and saves the next compute waits for
  std::vector<int> next_allocs;  // activation buffers the next compute makes
};

// Gradients from their backward compute to their reduce, offload and the optimizer.
struct Grads {
  std::map<int, int> pending;  // unit -> its gradient buffer, while it still collects (tied embedding)
  std::vector<int> offloads;   // the steps that finish a gradient: the optimizer waits for all of them
  std::vector<int> done;       // per gradient in backward order: the step that frees its buffer
  std::map<int, int> written;  // grad16 on NVMe: unit -> the latest write of its slot (accumulation reads it back)
  // The tied embedding's gradient under stages, summed over the micro-steps: it leaves once the
  // stage's backward is done (the other stage's copy is whole only after its own backward).
  struct Tied {
    int unit = -1, buf = -1, compute = -1;
    double bytes = 0;
  };
  std::optional<Tied> tied;
};

// Checkpoints saved in forward, by (block, micro-batch of the iteration).
struct Ckpts {
  std::map<std::pair<int, int>, int> saved;  // the save step
  std::map<std::pair<int, int>, int> buf;    // its buffer
};

// The optimizer's chunks and the steps emitted for them (Sec. 5.2.2).
struct Optim {
  double n = 0, per_param = 0;
  int chunks = 0;
  std::vector<std::vector<int>> reads;
  std::vector<int> writes, adams, read_order;
  std::vector<int> bufs, params16;          // per chunk: its buffer, its staged 16-bit parameters
  std::vector<bool> emitted;
  std::vector<int> waiting;                 // backward: units of each chunk not yet final
  std::map<int, std::vector<int>> chunks_of;  // unit -> the chunks it has elements in
  std::vector<std::vector<int>> grad_deps;  // backward: the final gradient steps of its units
  int prev_adam = -1;
  int pending_alloc = -1;  // a chunk buffer no read made: the update makes it
  int grads16 = -1;        // every gradient staged in CPU memory (grads on the GPU)
  int last_refresh = -1;
  int norm = -1;           // gradient clipping: the step after which the global norm is known
};

// The context every phase works in.
// A pipeline stage's messages, each from or into one buffer of the stage's: a receive waits for
// the previous micro-step's pass that read what the last one brought (its last compute), and the
// compute that writes what a send carries waits for the previous send of that direction.
struct Pipe {
  int forward_done = -1, backward_done = -1;  // the last compute of the previous forward / backward
  int forward_sent = -1, backward_sent = -1;  // the previous send of each direction
  std::vector<int> forward_saves;             // checkpoints still copying the last forward's last block input
};

struct Builder {
  const Shape& sh;
  Emitter& e;
  Chain chain;
  Grads grads;
  Ckpts ckpts;
  Optim opt;
  std::vector<Pipe> pipe;  // per chunk
};

// schedule_fetch.cpp: runs `items` in order with the three-hop prefetch of Sec. 6.2; `before(i)`
// runs before item i's fetches are issued.
void run_items(Builder& b, const std::vector<Item>& items, const std::function<void(size_t)>& before = {});
// schedule_backward.cpp
void grad_ready(Builder& b, const Item& it, int compute_id);
void forward(Builder& b, int chunk);   // schedule_forward.cpp
// Checkpoints, by (block, micro-batch of the iteration); named per micro-step (schedule_forward.cpp).
std::pair<int, int> ckpt_key(const Builder& b, int block, int u);
std::string checkpoint_name(const Builder& b, int block, int u);
// One block's activation working memory per micro-batch (Eq. 5); 0 with a preallocated workspace.
double block_activation_bytes(const Shape& sh);
void backward(Builder& b, int chunk);  // schedule_backward.cpp
// schedule_optimizer.cpp
void plan_optimizer(Builder& b);
void delayed_update(Builder& b);
void optimizer(Builder& b);
void gradient_final(Builder& b, int unit, int final_step);
std::vector<int> delayed_update_readers(const Builder& b, int unit);
// schedule_pipeline.cpp: one send or receive of a chunk's activations or their gradients.
int p2p(Builder& b, Phase ph, Hop hop, int chunk, std::vector<int> d);

}  // namespace memwall::build
