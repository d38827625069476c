// The schedule's shape and emitter, and the compute lists with their three-hop parameter fetches
// (Sec. 6.2): nc (NVMe -> CPU) for group i+d, cg (CPU -> GPU) for i+d-1, gg (all-gather) for
// i+d-2 (d = prefetch depth), each group released after its last item.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>
#include "model/schedule_build.hpp"

namespace memwall::build {

Shape::Shape(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
             const HardwareProfile& profile, int rank_, int dp_, const MemorySizes& sizes, int stage_)
    : m(model), pl(placement), c(config), p(profile), rank(rank_), dp(dp_), stage(stage_), pp(std::max(1, config.pp)),
      micro_batches(placement.layer_major ? std::max(1, config.micro_batches) : 1),
      grad_accum(std::max(1, config.grad_accum)), v(std::max(1, config.virtual_stages)), z(sizes),
      g(build_gpt_graph(model, config.bsz, config.seq, config.what_if.attention_density)),
      chunks(stage_chunks(model.layers, std::max(1, config.pp), std::max(1, config.virtual_stages), stage_)) {
  collective_link = dp * c.mp > p.gpus_per_node ? LinkClass::network : LinkClass::gpu_gpu;
  // Pipeline stages: consecutive stages sit on consecutive GPUs (dp x mp each, stage-major), so
  // activations cross between nodes where a stage boundary is a node boundary.
  if (pp > 1) {
    const long per_stage = long(dp) * c.mp;
    auto node_of = [&](int st) { return long(st) * per_stage / p.gpus_per_node; };
    auto link = [&](int a, int b) { return node_of(a) != node_of(b) ? LinkClass::network : LinkClass::gpu_gpu; };
    if (stage > 0 || v > 1) p2p_prev = link(prev_stage(), stage);
    if (stage + 1 < pp || v > 1) p2p_next = link(next_stage(), stage);
    tied_link = link(0, pp - 1);
  }
  std::map<std::string, size_t> index;
  std::map<std::pair<OpRole, int>, size_t> by_role;
  op_index.assign(g.size(), -1);
  for (size_t v : g.order) {
    const Operator& op = g.op(v);
    index[op.name] = v;
    by_role[{op.role, op.block}] = v;
    op_index[v] = int(ops.size());
    ops.push_back({op.name, op.kind, op.role, op.block, op.copies, op.fwd_flops, op.bwd_flops,
                   (op.act_read_bytes + op.act_write_bytes) * z.act_bytes / kGraphActBytes});
  }
  owner.assign(g.size(), SIZE_MAX);
  for (size_t v : g.order)
    if (!g.op(v).param_owner.empty()) owner[v] = index.at(g.op(v).param_owner);
  for (size_t v : g.order)
    if (g.op(v).block < 0 && computes(v)) (g.op(v).role == OpRole::embed ? head_ops : tail_ops).push_back(v);
  ops_of_block.assign(size_t(std::max(m.layers, 0)), {});
  for (size_t v : g.order)
    if (const int b = g.op(v).block; b >= 0 && size_t(b) < ops_of_block.size()) ops_of_block[size_t(b)].push_back(v);
  // The units: param_units' order, with this rank's part of each (ScheduleUnit).
  const std::vector<ParamUnit> pu = param_units(m, c, stage);
  const std::vector<int> roots = broadcast() ? broadcast_owners(pu, dp) : std::vector<int>();
  double whole_at = 0, part_at = 0;
  for (size_t i = 0; i < pu.size(); ++i) {
    ScheduleUnit u;
    static_cast<ParamUnit&>(u) = pu[i];
    u.shard = u.elems / unit_ranks(u);
    if (broadcast()) {
      u.root = roots[i];
      u.from = 0;
      u.len = u.root == rank ? u.elems : 0;
    } else {
      u.from = unit_rank(u) * u.shard;
      u.len = u.shard;
    }
    u.whole_at = whole_at;
    u.part_at = part_at;
    whole_at += u.elems;
    part_at += u.len;
    unit_of[{by_role.at({u.role, u.block}), u.tile}] = int(units.size());
    units.push_back(std::move(u));
  }
}

bool Shape::computes(size_t v) const {
  const Operator& op = g.op(v);
  if (op.block >= 0)
    return std::any_of(chunks.begin(), chunks.end(),
                       [&](const StageBlocks& k) { return op.block >= k.first && op.block < k.last; });
  return op.role == OpRole::embed ? first_stage() : last_stage();
}

std::vector<Item> Shape::items_of(const std::vector<std::pair<const std::vector<size_t>*, Phase>>& phases) const {
  std::vector<Item> out;
  for (int u = 0; u < micro_batches; ++u)
    for (const std::pair<const std::vector<size_t>*, Phase>& one : phases) {
      const std::vector<size_t>* list = one.first;
      const Phase ph = one.second;  // a variable, not a structured binding: lambdas capture it (clang)
      const bool reverse = ph == Phase::backward;
      auto add = [&](size_t v) {
        for (int t = 0; t < tiles(v); ++t)
          out.push_back({v, tiled(v) ? (reverse ? tiles(v) - 1 - t : t) : -1, micro_batches > 1 ? u : -1, ph});
      };
      if (reverse)
        for (auto it = list->rbegin(); it != list->rend(); ++it) add(*it);
      else
        for (size_t v : *list) add(v);
    }
  return out;
}

namespace {

// Work a device stream runs, which torch.cuda.synchronize() waits for: computes, collectives
// (pipeline messages aside), copies to and from the GPU, the optimizer and sums on the GPU.
bool on_device(const Step& st) {
  switch (st.kind) {
    case StepKind::compute: return true;
    case StepKind::p2p:
    case StepKind::release: return false;
    case StepKind::optimizer:
    case StepKind::accumulate:
    case StepKind::grad_norm: return st.src == Tier::gpu || is_collective(st);
    default: return st.link != LinkClass::nvme_cpu && st.link != LinkClass::none;
  }
}

}  // namespace

int Emitter::emit(Step st) {
  st.id = int(s_.steps.size());
  if (sh_.grad_accum > 1 && accum >= 0 && st.phase != Phase::optimizer) st.accum_step = accum;
  for (int d : st.deps)
    if (d < 0 || d >= st.id) throw std::logic_error("schedule dependency does not point backwards");
  if (st.link != LinkClass::none) s_.traffic_bytes[int(st.link)] += st.bytes;
  s_.compute_flops += st.flops;
  if (sh_.c.sync_fetches && on_device(st)) device_work_.push_back(st.id);
  if (sh_.c.sync_fetches && st.kind == StepKind::fetch && st.state == State::param16 && st.link != LinkClass::nvme_cpu)
    fetches_.push_back(st.id);
  s_.steps.push_back(std::move(st));
  return s_.steps.back().id;
}

int Emitter::buffer(BufferKind kind, std::string name, Tier tier, double bytes, int unit, int chunk) {
  Buffer b;
  b.name = std::move(name);
  b.kind = kind;
  b.tier = tier;
  b.bytes = bytes;
  b.unit = unit;
  b.chunk = chunk;
  s_.buffers.push_back(std::move(b));
  return int(s_.buffers.size()) - 1;
}

int Emitter::alloc(int step, BufferKind kind, std::string name, Tier tier, double bytes, int unit, int chunk) {
  const int id = buffer(kind, std::move(name), tier, bytes, unit, chunk);
  s_.steps[size_t(step)].allocs.push_back(id);
  return id;
}

Step transfer(const Transfer& t, std::string name, std::vector<int> d, int src_buf, int dst_buf) {
  Step st;
  st.kind = t.kind;
  st.phase = t.phase;
  st.hop = t.hop;
  st.state = t.state;
  st.bytes = t.bytes;
  st.src = t.src;
  st.dst = t.dst;
  st.link = t.link;
  st.name = std::move(name);
  st.deps = std::move(d);
  st.src_buf = src_buf;
  st.dst_buf = dst_buf;
  return st;
}

std::vector<int> deps(std::initializer_list<int> ids) {
  std::vector<int> out;
  for (int d : ids)
    if (d >= 0) out.push_back(d);
  return out;
}

LinkClass link_between(Tier a, Tier b) {
  if (a == b) return LinkClass::none;
  if (a == Tier::nvme || b == Tier::nvme) return LinkClass::nvme_cpu;
  return LinkClass::cpu_gpu;
}

namespace {

// The fetch hops of one parameter group, and the buffers they fill.
struct Fetch {
  int nc = -1, cg = -1, gg = -1;
  int buf = -1;     // the whole parameters on the GPU
  int staged = -1;  // read from NVMe into CPU memory
  bool fetched = false;
  int last() const { return gg >= 0 ? gg : cg >= 0 ? cg : nc; }
};

// Items of one operator (and tile, and phase) share one fetch: l2l's micro-batch loop revisits a
// layer's operators, whose parameters stay until the last micro-batch has used them. The groups of a
// compute list, numbered by first use; an operator appears in one loop of a list only (a block, a
// segment, the head or the tail), and operators that share parameters (the tied embedding and LM
// head) keep their own groups.
struct Groups {
  std::vector<Item> first;       // per group: its first item
  std::vector<size_t> of, end;   // per item: its group (SIZE_MAX: no parameters); per group: its last item
  std::vector<Fetch> f;
};

Groups group_items(const Shape& sh, const std::vector<Item>& items) {
  Groups gr;
  gr.of.assign(items.size(), SIZE_MAX);
  std::map<std::tuple<size_t, int, Phase>, size_t> open;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!sh.has_params(items[i].v)) continue;
    auto [at, fresh] = open.try_emplace({items[i].v, items[i].tile, items[i].phase}, gr.first.size());
    if (fresh) {
      gr.first.push_back(items[i]);
      gr.end.push_back(i);
    }
    gr.end[at->second] = i;
    gr.of[i] = at->second;
  }
  gr.f.resize(gr.first.size());
  return gr;
}

// Issues hop `h` (0 nc, 1 cg, 2 gg) of group `gi`, after the earlier hops of that group. Issued
// when the compute before the previous one finishes: prefetch runs `prefetch_depth` operators
// ahead, not arbitrarily far (the buffers it fills are bounded). Depth 0 fetches on demand, as
// ZeRO-3 did in the DeepSpeed releases v0.3.15 to v0.5.10 (their module trace never matched, so
// nothing was prefetched: microsoft/DeepSpeed issue #1069, fixed by PR #1453 in v0.6.0): the
// copy to the GPU and the all-gather wait for the compute before them, and the compute for them;
// only the NVMe read, on the host thread one operator ahead of the device, overlaps that compute.
void issue_hop(Builder& b, Groups& gr, size_t gi, int h) {
  const Shape& sh = b.sh;
  Emitter& e = b.e;
  if (sh.param_resident_always()) return;
  const bool on_demand = sh.c.prefetch_depth == 0;
  Fetch& fe = gr.f[gi];
  if ((h == 0 && fe.nc >= 0) || (h == 1 && fe.cg >= 0) || (h == 2 && fe.gg >= 0)) return;  // issued already
  const Item& it = gr.first[gi];
  const int unit = sh.unit(it);
  const ScheduleUnit& u = sh.units[size_t(unit)];
  const std::string key = u.name + "@" + to_string(it.phase);
  const double whole = sh.param_bytes(it.v);
  const Tier home = sh.pl.param16.tier;
  const bool bcast = sh.broadcast();
  const bool is_owner = u.root == sh.rank;
  const int ranks = sh.unit_ranks(u);  // dp, or dp / ep for a routed expert
  const double slice = sh.pl.param16.partitioned && !bcast ? whole / ranks : whole;
  const bool reads_slow = !bcast || is_owner;
  const Phase ph = it.phase;
  if (h == 0 && home == Tier::nvme && reads_slow) {
    fe.staged = e.buffer(BufferKind::staged_params, "nc:" + key, Tier::cpu, slice, unit);
    Step st = transfer({StepKind::fetch, ph, Hop::nc, State::param16, slice, Tier::nvme, Tier::cpu, LinkClass::nvme_cpu},
                       u.name, deps({b.chain.prev}), -1, fe.staged);
    st.unit = unit;
    fe.nc = e.emit(std::move(st));
    e.step(fe.nc).allocs.push_back(fe.staged);
  }
  if (h == 1 && home != Tier::gpu && reads_slow) {
    fe.buf = e.buffer(BufferKind::params, key, Tier::gpu, whole, unit);  // the gather buffer is whole
    Step st = transfer({StepKind::fetch, ph, Hop::cg, State::param16, slice, Tier::cpu, Tier::gpu, LinkClass::cpu_gpu},
                       u.name, on_demand ? deps({fe.nc, b.chain.last}) : deps({fe.nc >= 0 ? fe.nc : b.chain.prev}),
                       fe.staged, fe.buf);
    st.unit = unit;
    if (sh.c.sync_fetches) for (int d : e.take_device_work()) st.deps.push_back(d);
    fe.cg = e.emit(std::move(st));
    e.step(fe.cg).allocs.push_back(fe.buf);
    if (fe.staged >= 0) e.free_at(fe.cg, fe.staged);
    fe.fetched = true;
  }
  if (h == 2 && ranks > 1 && (sh.pl.param16.partitioned || bcast)) {
    const double got = bcast ? (is_owner ? 0 : whole) : whole - slice;
    // The gather reads this rank's slice from the buffer its cg filled, or from the persistent
    // shard on the GPU (zero3), and fills the rest of the buffer.
    const bool made = fe.buf >= 0;
    if (!made) fe.buf = e.buffer(BufferKind::params, key, Tier::gpu, whole, unit);
    Step st = transfer({StepKind::fetch, ph, bcast ? Hop::bcast : Hop::gg, State::param16, got, Tier::gpu, Tier::gpu,
                        sh.collective_link},
                       u.name, deps({fe.cg >= 0 ? fe.cg : on_demand ? b.chain.last : b.chain.prev}),
                       fe.fetched ? fe.buf : -1, fe.buf);
    st.unit = unit;
    st.collective = bcast ? CollectiveSpec{CollectiveKind::broadcast, CommGroup::dp, sh.dp, u.root, whole}
                          : CollectiveSpec{CollectiveKind::all_gather, sh.unit_group(u), ranks, -1, slice};
    if (sh.c.sync_fetches) for (int d : e.take_device_work()) st.deps.push_back(d);
    fe.gg = e.emit(std::move(st));
    if (!made) e.step(fe.gg).allocs.push_back(fe.buf);
    fe.fetched = true;
  }
}

// Megatron tensor slicing: the row-parallel outputs (proj, fc2) are all-reduced in forward and
// the column-parallel input gradients (qkv, fc1) in backward, once the operator's last tile (in
// the phase's order: forward runs tiles first to last, backward last to first) has added its part.
void megatron_allreduce(Builder& b, const Item& it) {
  const Shape& sh = b.sh;
  const Operator& op = sh.g.op(it.v);
  const Phase ph = it.phase;
  const bool fwd_point = op.role == OpRole::proj || op.role == OpRole::fc2;
  const bool bwd_point = op.role == OpRole::qkv || op.role == OpRole::fc1;
  if (!((ph != Phase::backward && fwd_point) || (ph == Phase::backward && bwd_point))) return;
  if (it.tile >= 0 && it.tile != (ph == Phase::backward ? 0 : sh.tiles(it.v) - 1)) return;
  const double act = sh.z.act_bytes * sh.act_elems();
  Step st = transfer({StepKind::allreduce, ph, Hop::mp, State::act_ckpt, 2.0 * act * (sh.c.mp - 1) / sh.c.mp,
                      Tier::gpu, Tier::gpu, LinkClass::gpu_gpu},
                     op.name, deps({b.chain.last}));
  st.state.reset();
  st.op = sh.op_index[it.v];
  st.micro_batch = it.u;
  st.collective = {CollectiveKind::all_reduce, CommGroup::mp, sh.c.mp, -1, act};
  b.chain.last = b.e.emit(std::move(st));
}

// The buffer a backward compute accumulates its unit's gradient into (-1: the persistent grad16
// on the GPU); `fresh` when this compute makes it (the tied embedding's collects from the LM
// head's backward to the embedding's).
int grad_buffer(Builder& b, const Item& it, bool& fresh) {
  fresh = false;
  if (it.phase != Phase::backward || !b.sh.grad_has_buffer()) return -1;
  const int unit = b.sh.unit(it);
  if (auto p = b.grads.pending.find(unit); p != b.grads.pending.end()) return p->second;
  fresh = true;
  const int id = b.e.buffer(BufferKind::grad, "grad:" + b.sh.units[size_t(unit)].name, Tier::gpu,
                            b.sh.param_bytes(it.v), unit);
  b.grads.pending[unit] = id;
  return id;
}

int emit_compute(Builder& b, const Item& it, const Groups& gr, size_t gi) {
  const Shape& sh = b.sh;
  const Operator& op = sh.g.op(it.v);
  Step st;
  st.kind = StepKind::compute;
  st.phase = it.phase;
  st.name = op.name;
  st.op = sh.op_index[it.v];
  st.tile = it.tile;
  st.micro_batch = it.u;
  if (gi != SIZE_MAX) {
    st.unit = sh.unit(it);
    if (gr.f[gi].fetched) st.src_buf = gr.f[gi].buf;
  }
  const double share = sh.mp_share(it.v) / sh.tiles(it.v);
  st.flops = (it.phase == Phase::backward ? op.bwd_flops : op.fwd_flops) * share;
  st.deps = deps({b.chain.last, gi != SIZE_MAX ? gr.f[gi].last() : -1});
  st.deps.insert(st.deps.end(), b.chain.next_deps.begin(), b.chain.next_deps.end());
  b.chain.next_deps.clear();
  if (sh.c.sync_fetches)
    for (int f : b.e.take_fetches()) st.deps.push_back(f);
  // Gradient buffers are bounded: backward of op i overlaps the reduce-scatter of op i+1 and the
  // offload of op i+2 (Sec. 6.2), so it waits for op i+3's gradient to be gone.
  if (it.phase == Phase::backward && b.grads.done.size() >= 3) st.deps.push_back(b.grads.done[b.grads.done.size() - 3]);
  bool fresh = false;
  if (gi != SIZE_MAX) st.dst_buf = grad_buffer(b, it, fresh);
  st.allocs = std::move(b.chain.next_allocs);
  b.chain.next_allocs.clear();
  if (fresh) st.allocs.push_back(st.dst_buf);
  b.chain.prev = b.chain.last;
  b.chain.last = b.e.emit(std::move(st));
  return b.chain.last;
}

// Expert parallelism: the tokens routed to other ranks' experts cross the expert-parallel group
// all-to-all, after the router (dispatch) and after the experts' last unit (combine), in forward
// and recompute; in backward the gradients cross the other way, before the experts (after the
// residual's backward) and after them (after fc1's last unit). Each rank's send buffer is its
// tokens x experts per token x hidden activations; (ep - 1) / ep of it leaves the rank.
void moe_all_to_all(Builder& b, const Item& it) {
  const Shape& sh = b.sh;
  const Operator& op = sh.g.op(it.v);
  const bool bwd = it.phase == Phase::backward;
  const int last_tile = sh.tiled(it.v) ? (bwd ? 0 : sh.tiles(it.v) - 1) : -1;
  bool at = false;
  if (!bwd) at = (op.role == OpRole::router || op.role == OpRole::fc2) && it.tile == last_tile;
  else at = (op.role == OpRole::residual2 && sh.m.is_moe()) || (op.role == OpRole::fc1 && it.tile == last_tile);
  if (!at) return;
  const int ep = sh.c.ep;
  const double send = sh.z.act_bytes * sh.act_elems() * sh.m.moe.experts_per_token;
  const LinkClass link = long(ep) * sh.c.mp > sh.p.gpus_per_node ? LinkClass::network : LinkClass::gpu_gpu;
  Step st = transfer({StepKind::all_to_all, it.phase, Hop::a2a, State::act_ckpt, send * (ep - 1) / ep, Tier::gpu,
                      Tier::gpu, link},
                     op.name, deps({b.chain.last}));
  st.state.reset();
  st.micro_batch = it.u;
  st.collective = {CollectiveKind::all_to_all, CommGroup::ep, ep, -1, send};
  b.chain.last = b.e.emit(std::move(st));
}

}  // namespace

void run_items(Builder& b, const std::vector<Item>& items, const std::function<void(size_t)>& before) {
  const Shape& sh = b.sh;
  Groups gr = group_items(sh, items);
  const int d = sh.c.prefetch_depth;
  const int lookahead[3] = {d, std::max(d - 1, 0), std::max(d - 2, 0)};
  for (size_t i = 0; i < items.size(); ++i) {
    if (before) before(i);
    const Item& it = items[i];
    const size_t gi = gr.of[i];
    if (gi != SIZE_MAX && (i == 0 || gr.of[i - 1] != gi))
      for (int h = 0; h < 3; ++h)
        for (size_t k = gi; k <= std::min(gr.first.size() - 1, gi + size_t(lookahead[h])); ++k) issue_hop(b, gr, k, h);
    const int id = emit_compute(b, it, gr, gi);
    if (gi != SIZE_MAX && it.phase == Phase::backward) grad_ready(b, it, id);
    if (sh.c.mp > 1) megatron_allreduce(b, it);
    if (sh.c.ep > 1) moe_all_to_all(b, it);
    if (gi != SIZE_MAX && gr.end[gi] == i && gr.f[gi].fetched) {
      const int unit = sh.unit(it);
      Step rel;
      rel.kind = StepKind::release;
      rel.phase = it.phase;
      rel.name = sh.units[size_t(unit)].name;
      rel.unit = unit;
      rel.state = State::param16;
      rel.bytes = sh.param_bytes(it.v);
      rel.deps = deps({b.chain.last});
      rel.frees.push_back(gr.f[gi].buf);
      b.e.emit(std::move(rel));
    }
  }
}

}  // namespace memwall::build
