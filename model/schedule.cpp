#include "model/schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "model/units.hpp"

namespace memwall {

const char* to_string(StepKind k) {
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
  }
  return "?";
}
const char* to_string(Phase p) {
  switch (p) {
    case Phase::forward: return "fwd";
    case Phase::recompute: return "recompute";
    case Phase::backward: return "bwd";
    case Phase::optimizer: return "optim";
  }
  return "?";
}
const char* to_string(LinkClass l) {
  switch (l) {
    case LinkClass::none: return "none";
    case LinkClass::nvme_cpu: return "nvme_cpu";
    case LinkClass::cpu_gpu: return "cpu_gpu";
    case LinkClass::gpu_gpu: return "gpu_gpu";
    case LinkClass::network: return "network";
  }
  return "?";
}

namespace {

constexpr double kParamBytes = 2;   // fp16 parameter / gradient
constexpr double kOptimBytes = 16;  // fp32 master parameter, momentum, variance, gradient
constexpr double kActBytes = 2;

// One unit of work in a phase: an operator (or one tile of it) for one micro-batch.
struct Item {
  size_t v;
  int tile;
  int u;
  Phase phase = Phase::forward;
};

class Generator {
 public:
  Generator(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p, int rank,
            int dp)
      : m_(m), pl_(pl), c_(c), p_(p), rank_(rank), dp_(dp),
        g_(build_gpt_graph(m, c.bsz, c.seq)),
        micro_batches_(pl.layer_major ? std::max(1, c.micro_batches) : 1) {
    s_.strategy = pl.name;
    s_.rank = rank;
    s_.dp = dp;
    s_.mp = c.mp;
    s_.micro_batches = micro_batches_;
    s_.capacity_bytes[int(Tier::gpu)] = p.gpu_memory_bytes;
    s_.capacity_bytes[int(Tier::cpu)] = p.cpu_memory_bytes / p.gpus_per_node;
    s_.capacity_bytes[int(Tier::nvme)] = p.nvme_capacity_bytes / p.gpus_per_node;
    // A collective inside a node uses NVLink/NVSwitch; one spanning nodes is limited by the network.
    collective_link_ = dp * c.mp > p.gpus_per_node ? LinkClass::network : LinkClass::gpu_gpu;
    for (size_t v : g_.order) index_[g_.op(v).name] = v;
  }

  Schedule run() {
    place_persistent_states();
    forward();
    backward();
    optimizer();
    return std::move(s_);
  }

 private:
  // ---- sizes -------------------------------------------------------------------------------
  bool tiled(size_t v) const { return c_.tiling_factor > 1 && g_.op(v).kind == OpKind::linear; }
  int tiles(size_t v) const { return tiled(v) ? c_.tiling_factor : 1; }
  // Tensor slicing divides every operator but LayerNorm (replicated, tiny) across mp ranks.
  double mp_share(size_t v) const { return g_.op(v).kind == OpKind::layernorm ? 1.0 : 1.0 / c_.mp; }
  size_t owner(size_t v) const { return index_.at(g_.op(v).param_owner); }
  bool has_params(size_t v) const { return !g_.op(v).param_owner.empty(); }
  // fp16 bytes of the parameters a (tile of an) operator needs on this rank, whole (not sharded).
  double param_bytes(size_t v) const {
    size_t o = owner(v);
    return kParamBytes * g_.op(o).param_elems * mp_share(o) / tiles(o);
  }
  double model_param_elems() const {
    double n = 0;
    for (size_t v : g_.order) n += g_.op(v).param_elems * mp_share(v);
    return n;
  }
  double shard(const StatePlacement& sp) const { return sp.partitioned ? 1.0 / dp_ : 1.0; }

  // ---- memory accounting -------------------------------------------------------------------
  void hold(Tier t, double bytes, int step) {
    resident_[int(t)] += bytes;
    double& peak = s_.peak_bytes[int(t)];
    peak = std::max(peak, resident_[int(t)]);
    double cap = s_.capacity_bytes[int(t)];
    if (!s_.overflow && resident_[int(t)] > cap * (1 + 1e-12)) {
      const Step& st = s_.steps[std::max(step, 0)];
      std::string where = step < 0 ? "before the first step (persistent states)"
                                   : "at step " + std::to_string(step) + " (" + to_string(st.kind) + " " + st.op + ")";
      s_.overflow = Overflow{t, step, resident_[int(t)], cap,
                             std::string("out of memory on ") + to_string(t) + " " + where + ": needs " +
                                 format_bytes(resident_[int(t)]) + ", capacity " + format_bytes(cap) + " per rank"};
    }
  }
  void drop(Tier t, double bytes) { resident_[int(t)] -= bytes; }

  void place_persistent_states() {
    const double n = model_param_elems();
    persist(State::param16, kParamBytes * n * shard(pl_.param16));
    persist(State::grad16, kParamBytes * n * shard(pl_.grad16));
    persist(State::optim32, kOptimBytes * n * shard(pl_.optim32));
  }
  void persist(State st, double bytes) {
    s_.persistent_bytes[int(pl_.of(st).tier)][int(st)] += bytes;
    hold(pl_.of(st).tier, bytes, -1);
  }

  // ---- step emission -----------------------------------------------------------------------
  int emit(Step st) {
    st.id = int(s_.steps.size());
    for (int d : st.deps) assert_dep(d, st.id);
    if (st.link != LinkClass::none) s_.traffic_bytes[int(st.link)] += st.bytes;
    s_.compute_flops += st.flops;
    s_.steps.push_back(std::move(st));
    return s_.steps.back().id;
  }
  static void assert_dep(int d, int id) {
    if (d < 0 || d >= id) throw std::logic_error("schedule dependency does not point backwards");
  }
  static std::vector<int> deps(std::initializer_list<int> ids) {
    std::vector<int> out;
    for (int d : ids)
      if (d >= 0) out.push_back(d);
    return out;
  }
  static LinkClass link_between(Tier a, Tier b) {
    if (a == b) return LinkClass::none;
    if (a == Tier::nvme || b == Tier::nvme) return LinkClass::nvme_cpu;
    return LinkClass::cpu_gpu;
  }
  Step transfer(StepKind k, Phase ph, const std::string& op, const char* hop, State state, double bytes, Tier src,
                Tier dst, LinkClass link, std::vector<int> d) {
    Step st;
    st.kind = k;
    st.phase = ph;
    st.op = op;
    st.hop = hop;
    st.state = state;
    st.bytes = bytes;
    st.src = src;
    st.dst = dst;
    st.link = link;
    st.deps = std::move(d);
    return st;
  }

  // The compute before the one now being prepared: fetches issued here start when it does.
  int issue_point() const { return prev_compute_; }

  static Step with_param(Step st, std::string key) {
    st.param = std::move(key);
    return st;
  }

  // Fetch hops of one parameter group; returns the id of the last hop (or -1 if resident).
  struct Fetch {
    int nc = -1, cg = -1, gg = -1;
    int last() const { return gg >= 0 ? gg : cg >= 0 ? cg : nc; }
    bool fetched = false;
  };
  // A fetched parameter buffer: recompute and backward fetch the same tensor into separate buffers.
  std::string buffer_key(const Item& it) const { return tile_name(it) + "@" + to_string(it.phase); }
  std::string tile_name(const Item& it) const {
    std::string n = g_.op(owner(it.v)).name;
    if (it.tile >= 0) n += "[tile " + std::to_string(it.tile) + "]";
    return n;
  }
  bool param_resident_always() const { return pl_.param16.tier == Tier::gpu && !pl_.param16.partitioned; }

  // Issues hop `h` (0 nc, 1 cg, 2 gg) of group `gi`, after the earlier hops of that group.
  void issue_hop(std::vector<Fetch>& f, const std::vector<Item>& first, size_t gi, int h, Phase ph) {
    if (param_resident_always()) return;
    Fetch& fe = f[gi];
    const Item& it = first[gi];
    const std::string name = tile_name(it);
    const double whole = param_bytes(it.v);
    const Tier home = pl_.param16.tier;
    const bool bcast = pl_.fetch == ParamFetch::broadcast && dp_ > 1;
    const bool is_owner = int(gi % dp_) == rank_;
    const double slice = pl_.param16.partitioned && !bcast ? whole / dp_ : whole;
    const bool reads_slow = !bcast || is_owner;
    if (h == 0 && home == Tier::nvme && reads_slow && fe.nc < 0) {
      // Issued when the compute before it starts: prefetch runs `prefetch_depth` operators ahead,
      // not arbitrarily far (the buffers it fills are bounded).
      fe.nc = emit(with_param(transfer(StepKind::fetch, ph, name, "nc", State::param16, slice, Tier::nvme, Tier::cpu,
                                       LinkClass::nvme_cpu, deps({issue_point()})), buffer_key(it)));
      hold(Tier::cpu, slice, fe.nc);
    }
    if (h == 1 && home != Tier::gpu && reads_slow && fe.cg < 0) {
      fe.cg = emit(with_param(transfer(StepKind::fetch, ph, name, "cg", State::param16, slice, Tier::cpu, Tier::gpu,
                                       LinkClass::cpu_gpu, deps({fe.nc >= 0 ? fe.nc : issue_point()})),
                              buffer_key(it)));
      if (fe.nc >= 0) drop(Tier::cpu, slice);
      hold(Tier::gpu, whole, fe.cg);  // the gather buffer is allocated whole
      fe.fetched = true;
    }
    if (h == 2 && dp_ > 1 && (pl_.param16.partitioned || bcast) && fe.gg < 0) {
      const double got = bcast ? (is_owner ? 0 : whole) : whole - slice;
      fe.gg = emit(with_param(transfer(StepKind::fetch, ph, name, bcast ? "bcast" : "gg", State::param16, got,
                                       Tier::gpu, Tier::gpu, collective_link_, deps({fe.cg >= 0 ? fe.cg : issue_point()})),
                              buffer_key(it)));
      if (!fe.fetched) hold(Tier::gpu, whole, fe.gg);
      fe.fetched = true;
    }
  }

  // Runs `items` in order with the three-hop prefetch of Sec. 6.2: nc for group i+d, cg for i+d-1,
  // gg for i+d-2 (d = prefetch depth), releasing each group after its last item. Backward items
  // also reduce and offload gradients.
  void run_items(const std::vector<Item>& items, const std::function<void(size_t)>& before = {}) {
    // Consecutive items that use the same parameters share one fetch (l2l's micro-batch loop).
    std::vector<Item> first;
    std::vector<size_t> group_of(items.size(), SIZE_MAX);
    std::vector<size_t> group_end;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!has_params(items[i].v)) continue;
      bool same = !first.empty() && group_end.back() + 1 == i && owner(first.back().v) == owner(items[i].v) &&
                  first.back().tile == items[i].tile && first.back().phase == items[i].phase;
      if (!same) {
        first.push_back(items[i]);
        group_end.push_back(i);
      }
      group_end.back() = i;
      group_of[i] = first.size() - 1;
    }
    std::vector<Fetch> f(first.size());
    const int d = c_.prefetch_depth;
    const int lookahead[3] = {d, std::max(d - 1, 0), std::max(d - 2, 0)};
    for (size_t i = 0; i < items.size(); ++i) {
      if (before) before(i);
      const Item& it = items[i];
      const Phase ph = it.phase;
      const Operator& op = g_.op(it.v);
      const size_t gi = group_of[i];
      if (gi != SIZE_MAX && (i == 0 || group_of[i - 1] != gi)) {
        for (int h = 0; h < 3; ++h)
          for (size_t k = gi; k <= std::min(first.size() - 1, gi + size_t(lookahead[h])); ++k)
            issue_hop(f, first, k, h, first[k].phase);
      }
      Step st;
      st.kind = StepKind::compute;
      st.phase = ph;
      st.op = op.name;
      st.tile = it.tile;
      st.micro_batch = it.u;
      if (gi != SIZE_MAX) st.param = buffer_key(first[gi]);
      const double share = mp_share(it.v) / tiles(it.v);
      st.flops = (ph == Phase::backward ? op.bwd_flops : op.fwd_flops) * share;
      st.deps = deps({last_compute_, gi != SIZE_MAX ? f[gi].last() : -1});
      if (!load_ids_.empty()) {
        st.deps.insert(st.deps.end(), load_ids_.begin(), load_ids_.end());
        load_ids_.clear();
      }
      // Gradient buffers are bounded: backward of op i overlaps the reduce-scatter of op i+1 and
      // the offload of op i+2 (Sec. 6.2), so it waits for op i+3's gradient to be gone.
      if (ph == Phase::backward && grad_done_.size() >= 3) st.deps.push_back(grad_done_[grad_done_.size() - 3]);
      prev_compute_ = last_compute_;
      last_compute_ = emit(std::move(st));
      if (gi != SIZE_MAX && ph == Phase::backward) grad_ready(it, last_compute_);
      if (c_.mp > 1 && it.tile <= 0) megatron_allreduce(op, ph);
      if (gi != SIZE_MAX && group_end[gi] == i && f[gi].fetched) {
        Step rel;
        rel.kind = StepKind::release;
        rel.phase = ph;
        rel.op = tile_name(it);
        rel.param = buffer_key(first[gi]);
        rel.state = State::param16;
        rel.bytes = param_bytes(it.v);
        rel.deps = deps({last_compute_});
        drop(Tier::gpu, rel.bytes);
        emit(std::move(rel));
      }
    }
  }

  // Megatron tensor slicing: the row-parallel outputs (proj, fc2) are all-reduced in forward and
  // the column-parallel input gradients (qkv, fc1) in backward.
  void megatron_allreduce(const Operator& op, Phase ph) {
    const std::string n = op.name;
    bool fwd_point = n.ends_with(".proj") || n.ends_with(".fc2");
    bool bwd_point = n.ends_with(".qkv") || n.ends_with(".fc1");
    if (!((ph != Phase::backward && fwd_point) || (ph == Phase::backward && bwd_point))) return;
    const double act = kActBytes * c_.bsz * double(c_.seq) * double(m_.hidden);
    Step st = transfer(StepKind::allreduce, ph, n, "mp", State::act_ckpt, 2.0 * act * (c_.mp - 1) / c_.mp, Tier::gpu,
                       Tier::gpu, LinkClass::gpu_gpu, deps({last_compute_}));
    st.state.reset();
    last_compute_ = emit(std::move(st));
  }

  // Backward produced the gradient of (a tile of) an operator's parameters. Reduce it across the
  // data-parallel group and move this rank's part to the gradient tier once its last use is done
  // (the tied embedding collects gradients from lm_head and embed).
  void grad_ready(const Item& it, int compute_id) {
    const size_t o = owner(it.v);
    const double whole = param_bytes(it.v);
    const std::string key = tile_name(it);
    if (grad_pending_.insert(key).second) hold(Tier::gpu, whole, compute_id);
    if (it.v != o) return;  // lm_head: the embedding's backward comes later and finishes it
    if (it.u >= 0 && it.u + 1 < micro_batches_) return;  // l2l accumulates over micro-batches
    grad_pending_.erase(key);
    const StatePlacement& gp = pl_.grad16;
    const bool bcast = pl_.fetch == ParamFetch::broadcast && dp_ > 1;
    int prev = compute_id;
    double keep = whole;  // bytes of this gradient that stay on this GPU afterwards
    if (dp_ > 1 && gp.partitioned) {
      prev = emit(transfer(StepKind::reduce_scatter, Phase::backward, key, bcast ? "reduce" : "rs", State::grad16,
                           whole * (dp_ - 1) / dp_, Tier::gpu, Tier::gpu, collective_link_, deps({prev})));
      keep = bcast ? (int(grad_group_++ % dp_) == rank_ ? whole : 0) : whole / dp_;
    } else if (dp_ > 1) {
      prev = emit(transfer(StepKind::allreduce, Phase::backward, key, "ar", State::grad16,
                           2.0 * whole * (dp_ - 1) / dp_, Tier::gpu, Tier::gpu, collective_link_, deps({prev})));
    }
    drop(Tier::gpu, whole);
    if (gp.tier == Tier::gpu || keep <= 0) {  // the persistent grad16 buffer (counted up front) holds it
      grad_done_.push_back(prev);
      return;
    }
    prev = emit(transfer(StepKind::offload, Phase::backward, key, "gc", State::grad16, keep, Tier::gpu, Tier::cpu,
                         LinkClass::cpu_gpu, deps({prev})));
    offloads_.push_back(prev);
    grad_done_.push_back(prev);
    if (gp.tier == Tier::nvme)
      offloads_.push_back(emit(transfer(StepKind::offload, Phase::backward, key, "cn", State::grad16, keep, Tier::cpu,
                                        Tier::nvme, LinkClass::nvme_cpu, deps({prev}))));
  }

  // ---- phases ------------------------------------------------------------------------------
  std::vector<size_t> block_ops(int b) const {
    std::vector<size_t> out;
    for (size_t v : g_.order)
      if (g_.op(v).block == b) out.push_back(v);
    return out;
  }
  // Items of `ops` in order; l2l runs every micro-batch through one operator before the next.
  std::vector<Item> items_of(const std::vector<size_t>& ops, Phase ph) const {
    const bool reverse = ph == Phase::backward;
    std::vector<Item> out;
    auto add = [&](size_t v) {
      for (int t = 0; t < tiles(v); ++t) {
        int tile = tiled(v) ? (reverse ? tiles(v) - 1 - t : t) : -1;
        for (int u = 0; u < micro_batches_; ++u) out.push_back({v, tile, micro_batches_ > 1 ? u : -1, ph});
      }
    };
    if (reverse)
      for (auto it = ops.rbegin(); it != ops.rend(); ++it) add(*it);
    else
      for (size_t v : ops) add(v);
    return out;
  }
  double ckpt_bytes() const { return kActBytes * c_.bsz * double(c_.seq) * double(m_.hidden); }
  // Activations of one block kept in forward until the block ends (or, in backward, the AWM of a
  // checkpoint segment: Eq. 5 per block), per micro-batch.
  double block_activation_bytes() const { return awm_per_block_; }

  // Forward runs as one item list so prefetch crosses block boundaries; checkpoints are saved as
  // each segment starts, and one block's activations are held while it runs.
  void forward() {
    awm_per_block_ = c_.bsz * double(c_.seq) * (16.0 * m_.hidden + 2.0 * m_.heads * double(c_.seq)) / c_.mp;
    for (size_t v : g_.order)
      if (g_.op(v).block < 0) (g_.op(v).name == "embed" ? head_ops_ : tail_ops_).push_back(v);
    std::vector<Item> items = items_of(head_ops_, Phase::forward);
    for (int b = 0; b < m_.layers; ++b) {
      std::vector<Item> bi = items_of(block_ops(b), Phase::forward);
      items.insert(items.end(), bi.begin(), bi.end());
    }
    std::vector<Item> tail = items_of(tail_ops_, Phase::forward);
    items.insert(items.end(), tail.begin(), tail.end());
    const Tier ct = pl_.act_ckpt.tier;
    const double act = block_activation_bytes() * micro_batches_;
    int open_block = -1;
    run_items(items, [&](size_t i) {
      const int b = g_.op(items[i].v).block;
      if (b == open_block) return;
      if (open_block >= 0) drop(Tier::gpu, act);
      open_block = b;
      if (b < 0) return;
      if (b % c_.ci == 0)
        for (int u = 0; u < micro_batches_; ++u) {
          Step st = transfer(StepKind::save_ckpt, Phase::forward, "block" + std::to_string(b) + ".input",
                             ct == Tier::gpu ? "" : "gc", State::act_ckpt, ckpt_bytes(), Tier::gpu, ct,
                             link_between(Tier::gpu, ct), deps({last_compute_}));
          st.micro_batch = micro_batches_ > 1 ? u : -1;
          int id = emit(std::move(st));
          hold(ct, ckpt_bytes(), id);
          saved_[{b, u}] = id;
        }
      hold(Tier::gpu, act, last_compute_);
    });
  }

  // Backward runs as one item list: the tail, then per checkpoint segment (last first) the
  // recompute of its blocks followed by their backward, then the embedding. Each segment loads its
  // checkpoint and holds its activation working memory (Eq. 5 over ci blocks) while it runs.
  void backward() {
    const Tier ct = pl_.act_ckpt.tier;
    std::vector<Item> items = items_of(tail_ops_, Phase::backward);
    std::map<size_t, int> segment_start;  // item index -> first block of the segment starting there
    const int segments = (m_.layers + c_.ci - 1) / c_.ci;
    for (int sgi = segments - 1; sgi >= 0; --sgi) {
      const int b0 = sgi * c_.ci, b1 = std::min(m_.layers, b0 + c_.ci);
      std::vector<size_t> seg;
      for (int b = b0; b < b1; ++b)
        for (size_t v : block_ops(b)) seg.push_back(v);
      segment_start[items.size()] = b0;
      std::vector<Item> rc = items_of(seg, Phase::recompute), bw = items_of(seg, Phase::backward);
      items.insert(items.end(), rc.begin(), rc.end());
      items.insert(items.end(), bw.begin(), bw.end());
    }
    const size_t head_at = items.size();
    std::vector<Item> head = items_of(head_ops_, Phase::backward);
    items.insert(items.end(), head.begin(), head.end());
    double open_awm = 0;
    auto close_segment = [&]() {
      if (open_awm <= 0) return;
      drop(Tier::gpu, open_awm);
      drop(Tier::gpu, ckpt_bytes() * micro_batches_);  // the loaded copy (or the GPU-resident one)
      if (ct != Tier::gpu) drop(ct, ckpt_bytes() * micro_batches_);
      open_awm = 0;
    };
    run_items(items, [&](size_t i) {
      if (i == head_at) close_segment();
      auto it = segment_start.find(i);
      if (it == segment_start.end()) return;
      close_segment();
      const int b0 = it->second;
      for (int u = 0; u < micro_batches_; ++u) {
        Step st = transfer(StepKind::load_ckpt, Phase::recompute, "block" + std::to_string(b0) + ".input",
                           ct == Tier::gpu ? "" : "cg", State::act_ckpt, ckpt_bytes(), ct, Tier::gpu,
                           link_between(ct, Tier::gpu), deps({saved_.at({b0, u}), last_compute_}));
        // Not prefetched: the checkpoint's buffer is free only once the later segment is done.
        st.micro_batch = micro_batches_ > 1 ? u : -1;
        int id = emit(std::move(st));
        if (ct != Tier::gpu) hold(Tier::gpu, ckpt_bytes(), id);
        load_ids_.push_back(id);
      }
      open_awm = block_activation_bytes() * std::min(c_.ci, m_.layers - b0) * micro_batches_;
      hold(Tier::gpu, open_awm, last_compute_);
    });
    close_segment();
  }

  // Optimizer step on this rank's partition (Sec. 5.2.2): in chunks sized to the pinned buffers
  // when the states live on NVMe, reading chunk i+1 and writing chunk i-1 while chunk i updates.
  void optimizer() {
    const double n = model_param_elems() * shard(pl_.optim32);
    std::vector<int> all_grads = offloads_;
    all_grads.push_back(last_compute_);
    const Tier ot = pl_.optim32.tier;
    const Tier pt = pl_.param16.tier;
    if (ot == Tier::gpu) {
      Step st;
      st.kind = StepKind::optimizer;
      st.phase = Phase::optimizer;
      st.op = "adam";
      st.params = n;
      st.src = st.dst = Tier::gpu;
      st.deps = all_grads;
      int id = emit(std::move(st));
      refresh_params(id, n);
      return;
    }
    // Gradients kept on the GPU go to the CPU that runs the optimizer (ZeRO-Offload, ZeRO-2 + CPU).
    if (pl_.grad16.tier == Tier::gpu) {
      int id = emit(transfer(StepKind::offload, Phase::optimizer, "grads", "gc", State::grad16, kParamBytes * n,
                             Tier::gpu, Tier::cpu, LinkClass::cpu_gpu, all_grads));
      all_grads = {id};
    }
    // Pinned staging: three chunk buffers per rank (read-ahead, update, write-behind).
    const double pinned_per_rank = p_.pinned_budget_bytes / p_.gpus_per_node;
    const double bytes_per_param = kOptimBytes + kParamBytes;  // states + the gradient read with them
    double chunk = ot == Tier::nvme ? std::max(1.0, std::floor(pinned_per_rank / (3 * bytes_per_param))) : n;
    const int chunks = int(std::min(1e6, std::ceil(n / chunk)));
    chunk = n / chunks;
    std::vector<int> writes;
    int prev_adam = -1;
    for (int k = 0; k < chunks; ++k) {
      const std::string name = "adam[chunk " + std::to_string(k) + "]";
      int read = -1, read_g = -1;
      if (ot == Tier::nvme) {
        std::vector<int> d = all_grads;
        if (k >= 3) d.push_back(writes[k - 3]);  // buffer k % 3 is free again
        read = emit(transfer(StepKind::fetch, Phase::optimizer, name, "nc", State::optim32, kOptimBytes * chunk,
                             Tier::nvme, Tier::cpu, LinkClass::nvme_cpu, d));
        if (pl_.grad16.tier == Tier::nvme)
          read_g = emit(transfer(StepKind::fetch, Phase::optimizer, name, "nc", State::grad16, kParamBytes * chunk,
                                 Tier::nvme, Tier::cpu, LinkClass::nvme_cpu, d));
        hold(Tier::cpu, bytes_per_param * chunk, read);
      }
      Step st;
      st.kind = StepKind::optimizer;
      st.phase = Phase::optimizer;
      st.op = name;
      st.params = chunk;
      st.src = st.dst = Tier::cpu;
      st.deps = deps({read, read_g, prev_adam});
      if (read < 0) st.deps = all_grads;
      prev_adam = emit(std::move(st));
      if (ot == Tier::nvme) {
        int w = emit(transfer(StepKind::offload, Phase::optimizer, name, "cn", State::optim32, kOptimBytes * chunk,
                              Tier::cpu, Tier::nvme, LinkClass::nvme_cpu, deps({prev_adam})));
        if (pt == Tier::nvme)
          w = emit(transfer(StepKind::offload, Phase::optimizer, name, "cn", State::param16, kParamBytes * chunk,
                            Tier::cpu, Tier::nvme, LinkClass::nvme_cpu, deps({prev_adam})));
        drop(Tier::cpu, bytes_per_param * chunk);
        writes.push_back(w);
      }
    }
    refresh_params(prev_adam, n);
  }

  // Updated fp16 parameters go back to where param16 lives: to the GPUs when it is resident there
  // (each rank copies its partition and the group all-gathers, or the owner broadcasts).
  void refresh_params(int after, double optim_params) {
    if (pl_.param16.tier != Tier::gpu || pl_.optim32.tier == Tier::gpu) return;
    const double whole = kParamBytes * optim_params * (pl_.optim32.partitioned ? dp_ : 1);
    const double mine = kParamBytes * optim_params;
    int cg = emit(transfer(StepKind::fetch, Phase::optimizer, "params", "cg", State::param16, mine, Tier::cpu,
                           Tier::gpu, LinkClass::cpu_gpu, deps({after})));
    if (dp_ > 1 && !pl_.param16.partitioned && pl_.optim32.partitioned)
      emit(transfer(StepKind::fetch, Phase::optimizer, "params", pl_.fetch == ParamFetch::broadcast ? "bcast" : "gg",
                    State::param16, whole - mine, Tier::gpu, Tier::gpu, collective_link_, deps({cg})));
  }

  const ModelSpec& m_;
  const Placement& pl_;
  const TrainingConfig& c_;
  const HardwareProfile& p_;
  int rank_, dp_;
  OperatorGraph g_;
  int micro_batches_;
  Schedule s_;
  LinkClass collective_link_ = LinkClass::gpu_gpu;
  std::map<std::string, size_t> index_;
  std::array<double, kTiers> resident_{};
  int last_compute_ = -1;
  int prev_compute_ = -1;
  std::set<std::string> grad_pending_;
  size_t grad_group_ = 0;
  std::vector<int> offloads_;
  std::map<std::pair<int, int>, int> saved_;
  std::vector<size_t> head_ops_, tail_ops_;
  std::vector<int> load_ids_;   // checkpoint loads the next compute waits for
  std::vector<int> grad_done_;  // per gradient group in backward order: the step that frees its buffer
  double awm_per_block_ = 0;
};

}  // namespace

Result<Schedule> build_schedule(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                const HardwareProfile& profile, int rank) {
  Result<Placement> ok = validate(placement);
  if (!ok) return make_error(ok.error());
  Result<TrainingConfig> cfg = validate(config, model.layers);
  if (!cfg) return make_error(cfg.error());
  if (config.mp > profile.gpus_per_node)
    return make_error("--mp: tensor slicing stays inside a node of " + std::to_string(profile.gpus_per_node) +
                      " GPUs, got " + std::to_string(config.mp));
  const int dp = config.dp > 0 ? config.dp : profile.total_gpus() / config.mp;
  if (dp < 1 || dp * config.mp > profile.total_gpus())
    return make_error("--dp/--mp: " + std::to_string(dp) + " x " + std::to_string(config.mp) + " GPUs asked, profile " +
                      profile.name + " has " + std::to_string(profile.total_gpus()) + "; add nodes with --nodes");
  if (rank < 0 || rank >= dp)
    return make_error("--rank: expected 0.." + std::to_string(dp - 1) + ", got " + std::to_string(rank));
  if (config.micro_batches > 1 && !placement.layer_major)
    return make_error("--micro-batches: only the layer-major l2l schedule loops over micro-batches inside an iteration");
  return Generator(model, placement, config, profile, rank, dp).run();
}

std::vector<std::string> check_invariants(const Schedule& s) {
  std::vector<std::string> bad;
  auto fail = [&](const Step& st, const std::string& what) {
    if (bad.size() < 20)
      bad.push_back("step " + std::to_string(st.id) + " (" + to_string(st.kind) + " " + st.op + "): " + what);
  };
  bool params_fetched = false;
  for (const Step& st : s.steps) params_fetched = params_fetched || (st.kind == StepKind::fetch && !st.param.empty());
  std::map<std::string, int> last_fetch;  // parameter -> latest fetch step while it is on the GPU
  std::set<std::string> ordered;          // parameters whose current fetch a compute already waited for
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    if (st.id != int(i)) fail(st, "id out of order");
    for (int d : st.deps)
      if (d < 0 || d >= st.id) fail(st, "dependency " + std::to_string(d) + " does not point to an earlier step");
    if (st.link != LinkClass::none) {
      bool collective = st.link == LinkClass::gpu_gpu || st.link == LinkClass::network;
      if (!(st.bytes > 0) && st.hop != "bcast") fail(st, "moves no bytes");
      if (!collective && st.src == st.dst) fail(st, "source and destination are the same tier");
    }
    if (st.kind == StepKind::fetch && !st.param.empty()) {
      last_fetch[st.param] = st.id;
      ordered.erase(st.param);
    } else if (st.kind == StepKind::release) {
      if (!last_fetch.erase(st.param)) fail(st, "releases " + st.param + ", which is not on the GPU");
    } else if (st.kind == StepKind::compute && !st.param.empty() && params_fetched) {
      auto f = last_fetch.find(st.param);
      if (f == last_fetch.end()) {
        fail(st, "parameters of " + st.param + " are not on the GPU");
      } else if (!ordered.count(st.param)) {
        // The first compute after a fetch must wait for its last hop; later ones (the l2l
        // micro-batch loop) follow that compute.
        if (std::find(st.deps.begin(), st.deps.end(), f->second) == st.deps.end())
          fail(st, "does not wait for the fetch of " + st.param + " (step " + std::to_string(f->second) + ")");
        ordered.insert(st.param);
      }
    }
  }
  for (const auto& [param, step] : last_fetch)
    bad.push_back(param + ": fetched at step " + std::to_string(step) + " but never released");
  return bad;
}

std::string schedule_text(const Schedule& s) {
  std::string out;
  char line[512];
  for (const Step& st : s.steps) {
    std::string what = to_string(st.kind);
    if (!st.hop.empty()) what += "." + st.hop;
    std::string op = st.op;
    if (st.tile >= 0 && st.kind == StepKind::compute) op += "[tile " + std::to_string(st.tile) + "]";
    if (st.micro_batch >= 0) op += " mb" + std::to_string(st.micro_batch);
    std::string amount;
    if (st.flops > 0) amount = format_sig(st.flops / 1e9, 3) + " GFLOP";
    else if (st.params > 0) amount = format_count(st.params) + " params";
    else if (st.bytes > 0) amount = format_bytes(st.bytes);
    std::string route;
    if (st.link != LinkClass::none) route = std::string(to_string(st.src)) + "->" + to_string(st.dst) + " " + to_string(st.link);
    std::string d;
    for (int x : st.deps) d += (d.empty() ? "" : ",") + std::to_string(x);
    std::snprintf(line, sizeof line, "%5d %-9s %-20s %-28s %12s  %-22s %s\n", st.id, to_string(st.phase), what.c_str(),
                  op.c_str(), amount.c_str(), route.c_str(), d.empty() ? "" : ("<- " + d).c_str());
    std::string l(line);
    while (l.size() > 1 && l[l.size() - 2] == ' ') l.erase(l.size() - 2, 1);
    out += l;
  }
  return out;
}

}  // namespace memwall
