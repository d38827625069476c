#include "model/schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "model/analysis.hpp"
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
    case StepKind::p2p: return "p2p";
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
            int dp, const MemorySizes& sizes, int stage)
      : m_(m), pl_(pl), c_(c), p_(p), rank_(rank), dp_(dp), z_(sizes),
        g_(build_gpt_graph(m, c.bsz, c.seq, c.what_if.attention_density)),
        stage_(stage), pp_(std::max(1, c.pp)), blocks_(stage_blocks(m.layers, std::max(1, c.pp), stage)),
        micro_batches_(pl.layer_major ? std::max(1, c.micro_batches) : 1), grad_accum_(std::max(1, c.grad_accum)) {
    s_.strategy = pl.name;
    s_.grad_accum = grad_accum_;
    s_.pp = pp_;
    s_.stage = stage_;
    s_.rank = rank;
    s_.dp = dp;
    s_.mp = c.mp;
    s_.micro_batches = micro_batches_;
    s_.sizes = sizes;
    s_.optimizer_overlap = c.optimizer_overlap;
    s_.capacity_bytes = capacity_per_rank(c, p);
    // A collective inside a node uses NVLink/NVSwitch; one spanning nodes is limited by the network.
    collective_link_ = dp * c.mp > p.gpus_per_node ? LinkClass::network : LinkClass::gpu_gpu;
    for (size_t v : g_.order) index_[g_.op(v).name] = v;
    owner_.assign(g_.size(), SIZE_MAX);
    for (size_t v : g_.order)
      if (!g_.op(v).param_owner.empty()) owner_[v] = index_.at(g_.op(v).param_owner);
    // Pipeline stages: consecutive stages sit on consecutive GPUs (dp x mp each, stage-major), so
    // activations cross between nodes where a stage boundary is a node boundary.
    if (pp_ > 1) {
      const long per_stage = long(dp) * c.mp;
      auto node_of = [&](int st) { return long(st) * per_stage / p.gpus_per_node; };
      if (stage_ > 0) p2p_prev_ = node_of(stage_ - 1) != node_of(stage_) ? LinkClass::network : LinkClass::gpu_gpu;
      if (stage_ + 1 < pp_) p2p_next_ = node_of(stage_ + 1) != node_of(stage_) ? LinkClass::network : LinkClass::gpu_gpu;
    }
    assign_ranks();
  }

  Schedule run() {
    place_persistent_states();
    plan_optimizer();
    delayed_update();
    // Gradient accumulation: forward and backward once per micro-step, the optimizer once. A
    // pipeline stage runs them 1F1B: (pp - stage - 1) forwards first, then one forward and one
    // backward in turn, then the remaining backwards.
    const int warmup = std::min(pp_ - stage_ - 1, grad_accum_);
    std::vector<std::pair<bool, int>> order;  // (forward?, micro-step)
    for (int u = 0; u < warmup; ++u) order.push_back({true, u});
    for (int j = 0; j < grad_accum_ - warmup; ++j) {
      order.push_back({true, warmup + j});
      order.push_back({false, j});
    }
    for (int j = grad_accum_ - warmup; j < grad_accum_; ++j) order.push_back({false, j});
    for (const auto& [fwd, u] : order) {
      accum_ = u;
      if (fwd) forward();
      else backward();
    }
    accum_ = -1;
    optimizer();
    if (workspace() && !s_.steps.empty()) {
      s_.steps.front().allocs.push_back({"workspace", Tier::gpu, z_.workspace_bytes});
      s_.steps.back().frees.push_back("workspace");
    }
    account_memory();
    return std::move(s_);
  }

 private:
  // ---- sizes -------------------------------------------------------------------------------
  bool tiled(size_t v) const { return c_.tiling_factor > 1 && g_.op(v).kind == OpKind::linear; }
  int tiles(size_t v) const { return tiled(v) ? c_.tiling_factor : 1; }
  // Tensor slicing divides every operator but LayerNorm (replicated, tiny) across mp ranks.
  double mp_share(size_t v) const { return g_.op(v).kind == OpKind::layernorm ? 1.0 : 1.0 / c_.mp; }
  size_t owner(size_t v) const { return owner_[v]; }
  bool has_params(size_t v) const { return !g_.op(v).param_owner.empty(); }
  // 16-bit bytes of the parameters a (tile of an) operator needs on this rank, whole (not sharded).
  double param_bytes(size_t v) const {
    size_t o = owner(v);
    return z_.param_bytes * g_.op(o).param_elems * mp_share(o) / tiles(o);
  }
  // Pipeline stages: the operators this stage computes (its blocks; the embedding on the first, the
  // final LayerNorm and LM head on the last); the parameters it holds are param_units' (also the
  // tied embedding on the last stage, a copy as in Megatron; the two copies' gradient all-reduce is
  // left out).
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == pp_ - 1; }
  bool computes(size_t v) const {
    const Operator& op = g_.op(v);
    if (op.block >= 0) return op.block >= blocks_.first && op.block < blocks_.last;
    return op.name == "embed" ? first_stage() : last_stage();
  }
  double shard(const StatePlacement& sp) const { return sp.partitioned ? 1.0 / dp_ : 1.0; }
  bool workspace() const { return z_.workspace_bytes >= 0; }
  bool broadcast() const { return pl_.fetch == ParamFetch::broadcast && dp_ > 1; }
  // Units (parameter group, tile) in forward order with their (mp-sliced) elements: the memory
  // model's (param_units).
  template <typename F>
  void for_units(F f) const {
    for (const ParamUnit& u : units_) f(u.name, u.elems);
  }
  // The broadcast variant (ZeRO-Offload): each rank owns one contiguous range of whole units, of
  // about 1/dp of the parameters; it alone reads them from its CPU memory or NVMe and broadcasts
  // them, receives their reduced gradients and updates them (Sec. 6.1's contrast).
  void assign_ranks() {
    units_ = param_units(m_, c_, stage_);
    if (!broadcast()) return;
    const std::vector<int> owner = broadcast_owners(units_, dp_);
    for (size_t i = 0; i < units_.size(); ++i) unit_rank_[units_[i].name] = owner[i];
  }
  int unit_rank(const std::string& unit) const { return unit_rank_.at(unit); }
  // Elements of the parameters a state keeps on this rank (the memory model's kept_param_elems).
  double kept_elems(const StatePlacement& sp) const { return kept_param_elems(units_, pl_, sp, dp_, rank_); }

  // ---- memory ------------------------------------------------------------------------------
  // Buffers live on steps (allocs / frees); the peaks and the first overflow come from walking them
  // in order once everything is emitted, so the accounting is exactly what an executor replays.
  void alloc(int step, const std::string& name, Tier t, double bytes) {
    s_.steps[size_t(step)].allocs.push_back({name, t, bytes});
  }
  void free_at(int step, const std::string& name) { s_.steps[size_t(step)].frees.push_back(name); }

  void place_persistent_states() { s_.persistent_bytes = persistent_state_bytes(m_, pl_, c_, rank_, z_, stage_); }

  void account_memory() {
    std::array<double, kTiers> resident{};
    for (int t = 0; t < kTiers; ++t)
      for (double b : s_.persistent_bytes[size_t(t)]) resident[size_t(t)] += b;
    for (int t = 0; t < kTiers; ++t) check_capacity(Tier(t), resident[size_t(t)], -1);
    s_.peak_bytes = resident;
    std::map<std::string, Buffer> live;
    for (const Step& st : s_.steps) {
      for (const Buffer& b : st.allocs) {
        live[b.name] = b;
        resident[int(b.tier)] += b.bytes;
      }
      for (int t = 0; t < kTiers; ++t) {
        s_.peak_bytes[size_t(t)] = std::max(s_.peak_bytes[size_t(t)], resident[size_t(t)]);
        check_capacity(Tier(t), resident[size_t(t)], st.id);
      }
      for (const std::string& name : st.frees) {
        auto it = live.find(name);
        if (it == live.end()) continue;  // check_invariants reports it
        resident[int(it->second.tier)] -= it->second.bytes;
        live.erase(it);
      }
    }
  }
  void check_capacity(Tier t, double resident, int step) {
    const double cap = s_.capacity_bytes[int(t)];
    if (s_.overflow || resident <= cap * (1 + 1e-12)) return;
    std::string where = "before the first step (persistent states)";
    if (step >= 0) {
      const Step& st = s_.steps[size_t(step)];
      where = "at step " + std::to_string(step) + " (" + to_string(st.kind) + " " + st.op + ")";
    }
    s_.overflow = Overflow{t, step, resident, cap,
                           std::string("out of memory on ") + to_string(t) + " " + where + ": needs " +
                               format_bytes(resident) + ", capacity " + format_bytes(cap) + " per rank"};
  }

  // ---- step emission -----------------------------------------------------------------------
  int emit(Step st) {
    st.id = int(s_.steps.size());
    if (grad_accum_ > 1 && accum_ >= 0 && st.phase != Phase::optimizer) st.accum_step = accum_;
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
  static Step transfer(StepKind k, Phase ph, const std::string& op, const char* hop, State state, double bytes,
                       Tier src, Tier dst, LinkClass link, std::vector<int> d, std::string src_buf = "",
                       std::string dst_buf = "") {
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
    st.src_buf = std::move(src_buf);
    st.dst_buf = std::move(dst_buf);
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
  void issue_hop(std::vector<Fetch>& f, const std::vector<Item>& first, const std::vector<std::string>& names,
                 const std::vector<std::string>& keys, size_t gi, int h, Phase ph) {
    if (param_resident_always()) return;
    Fetch& fe = f[gi];
    if ((h == 0 && fe.nc >= 0) || (h == 1 && fe.cg >= 0) || (h == 2 && fe.gg >= 0)) return;  // issued already
    const Item& it = first[gi];
    const std::string& name = names[gi];
    const std::string& key = keys[gi];
    const double whole = param_bytes(it.v);
    const Tier home = pl_.param16.tier;
    const bool bcast = broadcast();
    const int root = bcast ? unit_rank(name) : -1;
    const bool is_owner = root == rank_;
    const double slice = pl_.param16.partitioned && !bcast ? whole / dp_ : whole;
    const bool reads_slow = !bcast || is_owner;
    if (h == 0 && home == Tier::nvme && reads_slow && fe.nc < 0) {
      // Issued when the compute before it starts: prefetch runs `prefetch_depth` operators ahead,
      // not arbitrarily far (the buffers it fills are bounded).
      fe.nc = emit(with_param(transfer(StepKind::fetch, ph, name, "nc", State::param16, slice, Tier::nvme, Tier::cpu,
                                       LinkClass::nvme_cpu, deps({issue_point()}), "", "nc:" + key),
                              key));
      alloc(fe.nc, "nc:" + key, Tier::cpu, slice);
    }
    if (h == 1 && home != Tier::gpu && reads_slow && fe.cg < 0) {
      fe.cg = emit(with_param(transfer(StepKind::fetch, ph, name, "cg", State::param16, slice, Tier::cpu, Tier::gpu,
                                       LinkClass::cpu_gpu, deps({fe.nc >= 0 ? fe.nc : issue_point()}),
                                       fe.nc >= 0 ? "nc:" + key : "", key),
                              key));
      alloc(fe.cg, key, Tier::gpu, whole);  // the gather buffer is allocated whole
      if (fe.nc >= 0) free_at(fe.cg, "nc:" + key);
      fe.fetched = true;
    }
    if (h == 2 && dp_ > 1 && (pl_.param16.partitioned || bcast) && fe.gg < 0) {
      const double got = bcast ? (is_owner ? 0 : whole) : whole - slice;
      // The gather reads this rank's slice from the buffer its cg filled, or from the persistent
      // shard on the GPU (zero3), and fills the rest of the buffer.
      fe.gg = emit(with_param(transfer(StepKind::fetch, ph, name, bcast ? "bcast" : "gg", State::param16, got,
                                       Tier::gpu, Tier::gpu, collective_link_,
                                       deps({fe.cg >= 0 ? fe.cg : issue_point()}), fe.fetched ? key : "", key),
                              key));
      s_.steps[size_t(fe.gg)].root = root;
      if (!fe.fetched) alloc(fe.gg, key, Tier::gpu, whole);
      fe.fetched = true;
    }
  }

  // Runs `items` in order with the three-hop prefetch of Sec. 6.2: nc for group i+d, cg for i+d-1,
  // gg for i+d-2 (d = prefetch depth), releasing each group after its last item. Backward items
  // also reduce and offload gradients. `before(i)` runs before item i's fetches are issued.
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
    std::vector<std::string> names, keys;  // per group, made once
    for (const Item& it : first) {
      names.push_back(tile_name(it));
      keys.push_back(buffer_key(it));
    }
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
            issue_hop(f, first, names, keys, k, h, first[k].phase);
      }
      Step st;
      st.kind = StepKind::compute;
      st.phase = ph;
      st.op = op.name;
      st.tile = it.tile;
      st.micro_batch = it.u;
      if (gi != SIZE_MAX) {
        st.param = keys[gi];
        if (f[gi].fetched) st.src_buf = st.param;
      }
      const double share = mp_share(it.v) / tiles(it.v);
      st.flops = (ph == Phase::backward ? op.bwd_flops : op.fwd_flops) * share;
      st.deps = deps({last_compute_, gi != SIZE_MAX ? f[gi].last() : -1});
      st.deps.insert(st.deps.end(), next_compute_deps_.begin(), next_compute_deps_.end());
      next_compute_deps_.clear();
      // Gradient buffers are bounded: backward of op i overlaps the reduce-scatter of op i+1 and
      // the offload of op i+2 (Sec. 6.2), so it waits for op i+3's gradient to be gone.
      if (ph == Phase::backward && grad_done_.size() >= 3) st.deps.push_back(grad_done_[grad_done_.size() - 3]);
      if (gi != SIZE_MAX && ph == Phase::backward) st.dst_buf = grad_buffer(it);
      st.allocs = std::move(next_compute_allocs_);
      next_compute_allocs_.clear();
      prev_compute_ = last_compute_;
      last_compute_ = emit(std::move(st));
      if (gi != SIZE_MAX && ph == Phase::backward) grad_ready(it, last_compute_);
      if (c_.mp > 1 && it.tile <= 0) megatron_allreduce(op, ph);
      if (gi != SIZE_MAX && group_end[gi] == i && f[gi].fetched) {
        Step rel;
        rel.kind = StepKind::release;
        rel.phase = ph;
        rel.op = names[gi];
        rel.param = keys[gi];
        rel.state = State::param16;
        rel.bytes = param_bytes(it.v);
        rel.deps = deps({last_compute_});
        rel.frees.push_back(rel.param);
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
    const double act = z_.act_bytes * c_.bsz * double(c_.seq) * double(m_.hidden);
    Step st = transfer(StepKind::allreduce, ph, n, "mp", State::act_ckpt, 2.0 * act * (c_.mp - 1) / c_.mp, Tier::gpu,
                       Tier::gpu, LinkClass::gpu_gpu, deps({last_compute_}));
    st.state.reset();
    last_compute_ = emit(std::move(st));
  }

  // Where a backward compute accumulates the gradient of its parameters: a buffer of its own when
  // a later step reduces or offloads it, otherwise the persistent grad16 on the GPU (its shard is
  // the whole gradient: unpartitioned, or dp 1).
  bool grad_has_buffer() const {
    const StatePlacement& gp = pl_.grad16;
    return gp.tier != Tier::gpu || (gp.partitioned && dp_ > 1);
  }
  std::string grad_buffer(const Item& it) const { return grad_has_buffer() ? "grad:" + tile_name(it) : ""; }

  // Bytes this rank receives in a gradient collective that uncompressed receives `bytes` in
  // `pieces` pieces (one per peer and pass): 1-bit Adam's compression stage shrinks them.
  double grad_collective_bytes(double bytes, double pieces) const {
    return c_.what_if.onebit_adam ? onebit_bytes(bytes, z_.param_bytes, pieces) : bytes;
  }

  // Backward produced the gradient of (a tile of) an operator's parameters. Reduce it across the
  // data-parallel group and move this rank's part to the gradient tier once its last use is done
  // (the tied embedding collects gradients from lm_head and embed).
  void grad_ready(const Item& it, int compute_id) {
    const size_t o = owner(it.v);
    const double whole = param_bytes(it.v);
    const std::string key = tile_name(it);
    const std::string buf = grad_buffer(it);
    if (!buf.empty() && grad_pending_.insert(key).second) alloc(compute_id, buf, Tier::gpu, whole);
    if (it.v != o && computes(o)) return;  // lm_head: the embedding's backward comes later and finishes it
    if (it.u >= 0 && it.u + 1 < micro_batches_) return;  // l2l accumulates over micro-batches
    grad_pending_.erase(key);
    const StatePlacement& gp = pl_.grad16;
    const bool bcast = broadcast();
    int prev = compute_id;
    double keep = whole;  // bytes of this gradient that stay on this GPU afterwards
    if (dp_ > 1 && gp.partitioned) {
      // reduce-scatters the buffer; this rank's part lands in its grad16 shard when that is on the GPU
      prev = emit(transfer(StepKind::reduce_scatter, Phase::backward, key, bcast ? "reduce" : "rs", State::grad16,
                           grad_collective_bytes(whole * (dp_ - 1) / dp_, dp_ - 1), Tier::gpu, Tier::gpu, collective_link_, deps({prev}), buf,
                           gp.tier == Tier::gpu ? "" : buf));
      if (bcast) s_.steps[size_t(prev)].root = unit_rank(key);
      keep = bcast ? (unit_rank(key) == rank_ ? whole : 0) : whole / dp_;
    } else if (dp_ > 1 && last_micro_step()) {
      // whole gradients on every rank accumulate locally; one all-reduce at the last micro-step
      prev = emit(transfer(StepKind::allreduce, Phase::backward, key, "ar", State::grad16,
                           grad_collective_bytes(2.0 * whole * (dp_ - 1) / dp_, 2.0 * (dp_ - 1)), Tier::gpu, Tier::gpu, collective_link_, deps({prev}), buf,
                           buf));
    }
    if (gp.tier == Tier::gpu || keep <= 0) {  // the persistent grad16 on the GPU holds it, or another rank does
      if (!buf.empty()) free_at(prev, buf);
      grad_done_.push_back(prev);
      if (prev != compute_id) offloads_.push_back(prev);  // the optimizer reads the reduced gradient
      return;
    }
    const bool to_nvme = gp.tier == Tier::nvme;
    const std::string staged = "gc:" + key;
    // dpu: the slot this gradient overwrites holds the previous iteration's until its update read it
    const std::vector<int> readers = delayed_update_readers(key);
    std::vector<int> gc_deps = deps({prev});
    if (!to_nvme) gc_deps.insert(gc_deps.end(), readers.begin(), readers.end());
    prev = emit(transfer(StepKind::offload, Phase::backward, key, "gc", State::grad16, keep, Tier::gpu, Tier::cpu,
                         LinkClass::cpu_gpu, gc_deps, buf, to_nvme ? staged : ""));
    free_at(prev, buf);
    offloads_.push_back(prev);
    grad_done_.push_back(prev);
    if (to_nvme) {
      alloc(prev, staged, Tier::cpu, keep);
      std::vector<int> cn_deps = deps({prev});
      cn_deps.insert(cn_deps.end(), readers.begin(), readers.end());
      int cn = emit(transfer(StepKind::offload, Phase::backward, key, "cn", State::grad16, keep, Tier::cpu,
                             Tier::nvme, LinkClass::nvme_cpu, cn_deps, staged, ""));
      free_at(cn, staged);
      offloads_.push_back(cn);
      prev = cn;
    }
    if (last_micro_step()) gradient_final(key, prev);
  }
  // Gradients are final (and the optimizer may read them) only in the last micro-step; partitioned
  // or offloaded ones are reduced and moved in every micro-step and accumulate where they land.
  bool last_micro_step() const { return accum_ < 0 || accum_ == grad_accum_ - 1; }

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
  double ckpt_bytes() const { return z_.act_bytes * c_.bsz * double(c_.seq) * double(m_.hidden); }
  // act_ckpt partitioned (DeepSpeed's partition_activations): each tensor-slicing rank keeps 1/mp
  // of a checkpoint (its inputs are the same on every slice) and the slices are all-gathered over
  // the mp group before the recompute.
  bool ckpt_gathered() const { return pl_.act_ckpt.partitioned && c_.mp > 1; }
  double kept_ckpt_bytes() const { return ckpt_bytes() / (ckpt_gathered() ? c_.mp : 1); }
  // Several micro-steps' checkpoints are alive at once in a pipeline (1F1B): named apart.
  std::string ckpt_name(int b, int u) const {
    return "block" + std::to_string(b) + ".input" + (micro_batches_ > 1 ? " mb" + std::to_string(u) : "") +
           (grad_accum_ > 1 ? " acc" + std::to_string(accum_) : "");
  }
  std::pair<int, int> ckpt_key(int b, int u) const { return {b, u + micro_batches_ * std::max(0, accum_)}; }
  // Pipeline stages send their output activations forward and their input gradients back, one
  // (B, T, C) tensor per micro-step, split over the tensor slices (Megatron's scatter/gather).
  double p2p_bytes() const { return z_.act_bytes * c_.bsz * double(c_.seq) * double(m_.hidden) / c_.mp; }
  int p2p(Phase ph, const char* hop, int peer, LinkClass link, std::vector<int> d) {
    const int b = std::string(hop) == "recv" ? (ph == Phase::forward ? blocks_.first : blocks_.last)
                                             : (ph == Phase::forward ? blocks_.last : blocks_.first);
    Step st = transfer(StepKind::p2p, ph, "block" + std::to_string(b) + ".input", hop, State::act_ckpt, p2p_bytes(),
                       Tier::gpu, Tier::gpu, link, std::move(d));
    st.state.reset();
    st.root = peer;  // the stage at the other end
    return emit(std::move(st));
  }
  // Activations of one block kept in forward until the block ends (or, in backward, the AWM of a
  // checkpoint segment: Eq. 5 per block), per micro-batch. Zero with a preallocated workspace.
  double block_activation_bytes() const { return workspace() ? 0 : awm_per_block_; }

  // Forward runs as one item list so prefetch crosses block boundaries; checkpoints are saved as
  // each segment starts, and one block's activations are held while it runs. A block's input is
  // the previous block's output, whose memory the next block reuses: the first compute after a
  // block waits for the checkpoint saved from that block's input.
  void forward() {
    awm_per_block_ = awm_bytes_eq5(c_.bsz, c_.seq, 1, m_.hidden, m_.heads, c_.what_if.attention_density) / c_.mp;
    if (!ops_split_) {
      for (size_t v : g_.order)
        if (g_.op(v).block < 0 && computes(v)) (g_.op(v).name == "embed" ? head_ops_ : tail_ops_).push_back(v);
      ops_split_ = true;
    }
    std::vector<Item> items = items_of(head_ops_, Phase::forward);
    if (!first_stage()) next_compute_deps_.push_back(p2p(Phase::forward, "recv", stage_ - 1, p2p_prev_, {}));
    for (int b = blocks_.first; b < blocks_.last; ++b) {
      std::vector<Item> bi = items_of(block_ops(b), Phase::forward);
      items.insert(items.end(), bi.begin(), bi.end());
    }
    std::vector<Item> tail = items_of(tail_ops_, Phase::forward);
    items.insert(items.end(), tail.begin(), tail.end());
    const Tier ct = pl_.act_ckpt.tier;
    const double act = block_activation_bytes() * micro_batches_;
    int open_block = -1;
    std::vector<int> saves_of_open;  // checkpoints taken from the open block's input
    run_items(items, [&](size_t i) {
      const int b = g_.op(items[i].v).block;
      if (b == open_block) return;
      if (open_block >= 0 && act > 0) free_at(last_compute_, "act:block" + std::to_string(open_block));
      next_compute_deps_.insert(next_compute_deps_.end(), saves_of_open.begin(), saves_of_open.end());
      saves_of_open.clear();
      open_block = b;
      if (b < 0) return;
      if ((b - blocks_.first) % c_.ci == 0)
        for (int u = 0; u < micro_batches_; ++u) {
          const std::string buf = "ckpt:" + ckpt_name(b, u);
          Step st = transfer(StepKind::save_ckpt, Phase::forward, "block" + std::to_string(b) + ".input",
                             ct == Tier::gpu ? "" : "gc", State::act_ckpt, kept_ckpt_bytes(), Tier::gpu, ct,
                             link_between(Tier::gpu, ct), deps({last_compute_}), "", buf);
          st.micro_batch = micro_batches_ > 1 ? u : -1;
          int id = emit(std::move(st));
          alloc(id, buf, ct, kept_ckpt_bytes());
          saved_[ckpt_key(b, u)] = id;
          saves_of_open.push_back(id);
        }
      if (act > 0) next_compute_allocs_.push_back({"act:block" + std::to_string(b), Tier::gpu, act});
    });
    // a stage without the LM head ends on a block: its activations go once the output is sent
    if (!last_stage()) {
      const int sent = p2p(Phase::forward, "send", stage_ + 1, p2p_next_, deps({last_compute_}));
      if (open_block >= 0 && act > 0) free_at(sent, "act:block" + std::to_string(open_block));
    }
    next_compute_deps_.clear();
  }

  // Backward runs as one item list: the tail, then per checkpoint segment (last first) the
  // recompute of its blocks followed by their backward, then the embedding. Each segment loads its
  // checkpoint and holds its activation working memory (Eq. 5 over ci blocks) while it runs.
  void backward() {
    const Tier ct = pl_.act_ckpt.tier;
    std::vector<Item> items = items_of(tail_ops_, Phase::backward);
    if (!last_stage()) next_compute_deps_.push_back(p2p(Phase::backward, "recv", stage_ + 1, p2p_next_, {}));
    std::map<size_t, int> segment_start;  // item index -> first block of the segment starting there
    const int segments = (blocks_.last - blocks_.first + c_.ci - 1) / c_.ci;
    for (int sgi = segments - 1; sgi >= 0; --sgi) {
      const int b0 = blocks_.first + sgi * c_.ci, b1 = std::min(blocks_.last, b0 + c_.ci);
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
    std::vector<std::string> open;  // buffers of the open segment, given back when it is done
    auto close_segment = [&]() {
      for (const std::string& b : open) free_at(last_compute_, b);
      open.clear();
    };
    run_items(items, [&](size_t i) {
      if (i == head_at) close_segment();
      auto it = segment_start.find(i);
      if (it == segment_start.end()) return;
      close_segment();
      const int b0 = it->second;
      for (int u = 0; u < micro_batches_; ++u) {
        const std::string saved = "ckpt:" + ckpt_name(b0, u);
        const std::string loaded = ct == Tier::gpu ? saved : "ckpt@gpu:" + ckpt_name(b0, u);
        Step st = transfer(StepKind::load_ckpt, Phase::recompute, "block" + std::to_string(b0) + ".input",
                           ct == Tier::gpu ? "" : "cg", State::act_ckpt, kept_ckpt_bytes(), ct, Tier::gpu,
                           link_between(ct, Tier::gpu), deps({saved_.at(ckpt_key(b0, u)), last_compute_}), saved, loaded);
        // Not prefetched: the checkpoint's buffer is free only once the later segment is done.
        st.micro_batch = micro_batches_ > 1 ? u : -1;
        int id = emit(std::move(st));
        if (ct != Tier::gpu) {
          alloc(id, loaded, Tier::gpu, kept_ckpt_bytes());
          open.push_back(loaded);
        }
        open.push_back(saved);
        if (ckpt_gathered()) {  // the other slices' parts, over the mp group, into a whole checkpoint
          const std::string whole = "ckpt@mp:" + ckpt_name(b0, u);
          Step g = transfer(StepKind::fetch, Phase::recompute, "block" + std::to_string(b0) + ".input", "mp",
                            State::act_ckpt, ckpt_bytes() - kept_ckpt_bytes(), Tier::gpu, Tier::gpu,
                            LinkClass::gpu_gpu, deps({id}), loaded, whole);
          g.micro_batch = st.micro_batch;
          id = emit(std::move(g));
          alloc(id, whole, Tier::gpu, ckpt_bytes());
          open.push_back(whole);
        }
        next_compute_deps_.push_back(id);
      }
      const double awm = block_activation_bytes() * std::min(c_.ci, blocks_.last - b0) * micro_batches_;
      if (awm > 0) {
        const std::string name = "awm:segment" + std::to_string(b0);
        next_compute_allocs_.push_back({name, Tier::gpu, awm});
        open.push_back(name);
      }
    });
    close_segment();
    if (!first_stage()) p2p(Phase::backward, "send", stage_ - 1, p2p_prev_, deps({last_compute_}));
  }

  // Optimizer step on this rank's partition (Sec. 5.2.2). With the states on NVMe it runs in chunks
  // sized to the pinned buffers: three chunk buffers, so the read of chunk i+1 and the write of
  // chunk i-1 overlap the update of chunk i. The list says so too: the reads of the first three
  // chunks come first, and the read of chunk i+3 follows the write that frees its buffer.
  // When it runs (TrainingConfig::optimizer_overlap): after backward (none); each chunk as soon as
  // the gradients of its units are final (backward: emitted from grad_ready); or before forward, on
  // the previous iteration's gradients, with the updated parameters copied to the GPU after this
  // iteration's last compute (dpu).
  struct OptimizerPlan {
    double n = 0, per_param = 0;
    int chunks = 0;
    std::vector<std::vector<int>> reads;
    std::vector<int> writes, adams, read_order;
    std::vector<bool> emitted;
    std::vector<int> waiting;                       // backward: units of each chunk not yet final
    std::map<std::string, std::vector<int>> chunks_of;  // unit -> the chunks it has elements in
    std::vector<std::vector<int>> grad_deps;        // backward: the final gradient steps of its units
    int prev_adam = -1;
  };

  Tier ot() const { return pl_.optim32.tier; }
  std::string chunk_name(int k) const { return "adam[chunk " + std::to_string(k) + "]"; }
  double chunk_size(int k) const { return s_.optimizer_chunks[size_t(k)].params; }

  void plan_optimizer() {
    OptimizerPlan& o = opt_;
    o.n = kept_elems(pl_.optim32);
    if (ot() == Tier::gpu) {
      s_.optimizer_chunks = {{0, o.n}};
      s_.optimizer_chunk_params = o.n;
      return;
    }
    o.per_param = optimizer_chunk_bytes_per_param(pl_, z_);
    s_.optimizer_chunks = optimizer_chunks(m_, pl_, c_, optimizer_chunk_target(pl_, c_, p_, o.n, z_), rank_, stage_);
    o.chunks = int(s_.optimizer_chunks.size());
    s_.optimizer_chunk_params = 0;
    for (const Schedule::Chunk& ch : s_.optimizer_chunks)
      s_.optimizer_chunk_params = std::max(s_.optimizer_chunk_params, ch.params);
    o.reads.assign(size_t(o.chunks), {});
    o.writes.assign(size_t(o.chunks), -1);
    o.adams.assign(size_t(o.chunks), -1);
    o.emitted.assign(size_t(o.chunks), false);
    o.waiting.assign(size_t(o.chunks), 0);
    o.grad_deps.assign(size_t(o.chunks), {});
    // which chunks each unit's elements fall in (the partition order of optimizer_chunks)
    const bool owners = broadcast() && pl_.optim32.partitioned;
    double at = 0;
    size_t k = 0;
    const std::vector<Schedule::Chunk>& ch = s_.optimizer_chunks;
    for_units([&](const std::string& name, double whole) {
      const double e = owners ? (unit_rank(name) == rank_ ? whole : 0) : whole * shard(pl_.optim32);
      if (e <= 0) return;
      const double end = at + e;
      while (k < ch.size() && ch[k].start + ch[k].params <= at) ++k;
      for (size_t j = k; j < ch.size() && ch[j].start < end; ++j) {
        o.chunks_of[name].push_back(int(j));
        ++o.waiting[j];
      }
      at = end;
    });
  }

  // backward: the gradient of `unit` is final at step `final_step`; a chunk whose units are all
  // final is emitted now.
  void gradient_final(const std::string& unit, int final_step) {
    if (c_.optimizer_overlap != OptimizerOverlap::backward || ot() == Tier::gpu) return;
    auto it = opt_.chunks_of.find(unit);
    if (it == opt_.chunks_of.end()) return;  // not in this rank's partition
    for (int k : it->second) {
      opt_.grad_deps[size_t(k)].push_back(final_step);
      if (--opt_.waiting[size_t(k)] == 0) {
        emit_read(k, opt_.grad_deps[size_t(k)]);
        emit_update(k, opt_.grad_deps[size_t(k)]);
      }
    }
  }

  void emit_read(int k, const std::vector<int>& after) {
    OptimizerPlan& o = opt_;
    const Tier gt = pl_.grad16.tier;
    if (o.per_param <= 0) return;
    std::vector<int> d = after;
    const size_t pos = o.read_order.size();
    if (pos >= 3) d.push_back(o.writes[size_t(o.read_order[pos - 3])]);  // its buffer is free again
    o.read_order.push_back(k);
    std::vector<int>& r = o.reads[size_t(k)];
    const std::string name = chunk_name(k);
    if (ot() == Tier::nvme)
      r.push_back(emit(transfer(StepKind::fetch, Phase::optimizer, name, "nc", State::optim32,
                                z_.optim_bytes * chunk_size(k), Tier::nvme, Tier::cpu, LinkClass::nvme_cpu, d, "",
                                name)));
    if (gt == Tier::nvme)
      r.push_back(emit(transfer(StepKind::fetch, Phase::optimizer, name, "nc", State::grad16,
                                z_.param_bytes * chunk_size(k), Tier::nvme, Tier::cpu, LinkClass::nvme_cpu, d, "",
                                name)));
    // every chunk buffer is the largest chunk's size: slots an executor rotates without
    // fragmenting its pinned memory
    const double slot = o.per_param * s_.optimizer_chunk_params;
    if (!r.empty()) alloc(r.front(), name, Tier::cpu, slot);
    else next_optim_alloc_ = {name, Tier::cpu, slot};
  }

  // Adam on chunk k, then its writes to NVMe and (parameters on the GPU) the copy back, unless dpu
  // holds that copy until this iteration's computes are done.
  void emit_update(int k, const std::vector<int>& after) {
    OptimizerPlan& o = opt_;
    const Tier pt = pl_.param16.tier, gt = pl_.grad16.tier;
    const std::string name = chunk_name(k);
    Step st;
    st.kind = StepKind::optimizer;
    st.phase = Phase::optimizer;
    st.op = name;
    st.params = chunk_size(k);
    st.src = st.dst = Tier::cpu;
    st.deps = deps({o.prev_adam});
    const std::vector<int>& r = o.reads[size_t(k)];
    st.deps.insert(st.deps.end(), r.begin(), r.end());
    if (r.empty()) st.deps.insert(st.deps.end(), after.begin(), after.end());
    if (o.per_param > 0) st.src_buf = st.dst_buf = name;
    if (!next_optim_alloc_.name.empty()) {
      st.allocs.push_back(next_optim_alloc_);
      next_optim_alloc_ = {};
    }
    if (pt == Tier::gpu) st.allocs.push_back({"params16:" + std::to_string(k), Tier::cpu, z_.param_bytes * chunk_size(k)});
    o.prev_adam = emit(std::move(st));
    o.adams[size_t(k)] = o.prev_adam;
    o.emitted[size_t(k)] = true;
    if (gt == Tier::gpu && std::all_of(o.emitted.begin(), o.emitted.end(), [](bool b) { return b; }))
      free_at(o.prev_adam, "grads16");
    int w = o.prev_adam;
    if (ot() == Tier::nvme)
      w = emit(transfer(StepKind::offload, Phase::optimizer, name, "cn", State::optim32, z_.optim_bytes * chunk_size(k),
                        Tier::cpu, Tier::nvme, LinkClass::nvme_cpu, deps({o.prev_adam}), name, ""));
    if (pt == Tier::nvme) {
      const int states = w;
      w = emit(transfer(StepKind::offload, Phase::optimizer, name, "cn", State::param16, z_.param_bytes * chunk_size(k),
                        Tier::cpu, Tier::nvme, LinkClass::nvme_cpu, deps({o.prev_adam}), name, ""));
      if (states != o.prev_adam) s_.steps[size_t(w)].deps.push_back(states);  // the buffer goes when both are out
    }
    if (o.per_param > 0) free_at(w, name);
    o.writes[size_t(k)] = w;
    if (pt == Tier::gpu && c_.optimizer_overlap != OptimizerOverlap::dpu) refresh_params(o.prev_adam, k);
  }

  void optimizer() {
    OptimizerPlan& o = opt_;
    const Tier pt = pl_.param16.tier, gt = pl_.grad16.tier;
    std::vector<int> all_grads = offloads_;
    all_grads.push_back(last_compute_);
    if (ot() == Tier::gpu) {
      Step st;
      st.kind = StepKind::optimizer;
      st.phase = Phase::optimizer;
      st.op = "adam";
      st.params = o.n;
      st.src = st.dst = Tier::gpu;
      st.deps = all_grads;
      int id = emit(std::move(st));
      // parameters whole on every GPU, optimizer states partitioned (ZeRO-2): each rank updated its
      // part in place, the group gathers the rest
      if (pt == Tier::gpu && !pl_.param16.partitioned && pl_.optim32.partitioned && dp_ > 1) {
        if (broadcast()) broadcast_params(id);
        else
          emit(transfer(StepKind::fetch, Phase::optimizer, "params", "gg", State::param16,
                        z_.param_bytes * o.n * (dp_ - 1), Tier::gpu, Tier::gpu, collective_link_, deps({id})));
      }
      return;
    }
    if (c_.optimizer_overlap == OptimizerOverlap::none) {
      // Gradients kept on the GPU go to the CPU that runs the optimizer (ZeRO-Offload, ZeRO-2 + CPU).
      if (gt == Tier::gpu) {
        int id = emit(transfer(StepKind::offload, Phase::optimizer, "grads", "gc", State::grad16,
                               z_.param_bytes * o.n, Tier::gpu, Tier::cpu, LinkClass::cpu_gpu, all_grads, "", "grads16"));
        alloc(id, "grads16", Tier::cpu, z_.param_bytes * o.n);
        all_grads = {id};
      }
      for (int k = 0; k < std::min(3, o.chunks); ++k) emit_read(k, all_grads);
      for (int k = 0; k < o.chunks; ++k) {
        emit_update(k, all_grads);
        if (k + 3 < o.chunks) emit_read(k + 3, all_grads);
      }
    } else if (c_.optimizer_overlap == OptimizerOverlap::dpu) {
      // the updates ran beside this iteration's computes: their parameters reach the GPU now
      for (int k = 0; k < o.chunks; ++k) refresh_params(o.adams[size_t(k)], k, last_compute_);
    } else {
      for (int k = 0; k < o.chunks; ++k)
        if (!o.emitted[size_t(k)]) throw std::logic_error("optimizer chunk never became ready in backward");
    }
    if (pt == Tier::gpu && !pl_.param16.partitioned && pl_.optim32.partitioned && broadcast())
      broadcast_params(last_refresh_ >= 0 ? last_refresh_ : o.prev_adam);
  }

  // dpu: the whole update, on the previous iteration's gradients, before this iteration's forward.
  void delayed_update() {
    if (c_.optimizer_overlap != OptimizerOverlap::dpu || ot() == Tier::gpu) return;
    for (int k = 0; k < std::min(3, opt_.chunks); ++k) emit_read(k, {});
    for (int k = 0; k < opt_.chunks; ++k) {
      emit_update(k, {});
      if (k + 3 < opt_.chunks) emit_read(k + 3, {});
    }
  }
  // dpu: a gradient may overwrite its slot on the optimizer's tier once the update that read the
  // previous iteration's is done.
  std::vector<int> delayed_update_readers(const std::string& unit) const {
    std::vector<int> out;
    if (c_.optimizer_overlap != OptimizerOverlap::dpu) return out;
    auto it = opt_.chunks_of.find(unit);
    if (it != opt_.chunks_of.end())
      for (int k : it->second) out.push_back(opt_.adams[size_t(k)]);
    return out;
  }

  // Updated 16-bit parameters go back to where param16 lives: to the GPUs when it is resident there
  // (each rank copies its partition and the group all-gathers, or the owner broadcasts).
  void refresh_params(int after, int k, int also_after = -1) {
    if (pl_.param16.tier != Tier::gpu || ot() == Tier::gpu) return;
    const double optim_params = chunk_size(k);
    const double whole = z_.param_bytes * optim_params * (pl_.optim32.partitioned ? dp_ : 1);
    const double mine = z_.param_bytes * optim_params;
    const std::string staged = "params16:" + std::to_string(k);
    int cg = emit(transfer(StepKind::fetch, Phase::optimizer, "params", "cg", State::param16, mine, Tier::cpu,
                           Tier::gpu, LinkClass::cpu_gpu, deps({after, also_after}), staged, ""));
    free_at(cg, staged);
    last_refresh_ = cg;
    if (dp_ > 1 && !pl_.param16.partitioned && pl_.optim32.partitioned && !broadcast())
      emit(transfer(StepKind::fetch, Phase::optimizer, "params", "gg", State::param16, whole - mine, Tier::gpu,
                    Tier::gpu, collective_link_, deps({cg})));
  }

  // The broadcast variant's refresh: every unit from the rank that owns (and updated) it, to every
  // rank, in unit order, once this rank's own updates are on its GPU.
  void broadcast_params(int after) {
    for_units([&](const std::string& name, double elems) {
      const int root = unit_rank(name);
      const double whole = z_.param_bytes * elems;
      Step st = transfer(StepKind::fetch, Phase::optimizer, name, "bcast", State::param16,
                         root == rank_ ? 0 : whole, Tier::gpu, Tier::gpu, collective_link_, deps({after}));
      st.root = root;
      emit(std::move(st));
    });
  }

  const ModelSpec& m_;
  const Placement& pl_;
  const TrainingConfig& c_;
  const HardwareProfile& p_;
  int rank_, dp_;
  MemorySizes z_;
  OperatorGraph g_;
  const int stage_, pp_;
  const StageBlocks blocks_;
  int micro_batches_;
  Schedule s_;
  LinkClass collective_link_ = LinkClass::gpu_gpu;
  std::map<std::string, size_t> index_;
  std::vector<size_t> owner_;  // per vertex: the operator whose parameters it uses (SIZE_MAX: none)
  int last_compute_ = -1;
  int prev_compute_ = -1;
  std::set<std::string> grad_pending_;
  std::map<std::string, int> unit_rank_;  // broadcast variant: the rank that owns each unit
  std::vector<ParamUnit> units_;          // the parameters this rank's stage holds, in forward order
  int last_refresh_ = -1;
  std::vector<int> offloads_;  // the steps that finish a gradient: the optimizer waits for all of them
  std::map<std::pair<int, int>, int> saved_;
  std::vector<size_t> head_ops_, tail_ops_;
  std::vector<int> next_compute_deps_;       // checkpoint loads and saves the next compute waits for
  std::vector<Buffer> next_compute_allocs_;  // activation memory the next compute makes
  Buffer next_optim_alloc_;                  // a chunk buffer with no read to carry it
  OptimizerPlan opt_;
  std::vector<int> grad_done_;  // per gradient group in backward order: the step that frees its buffer
  double awm_per_block_ = 0;
  const int grad_accum_;
  int accum_ = -1;  // the micro-step being emitted; -1 before and after them
  bool ops_split_ = false;  // head_ops_ / tail_ops_ made
  LinkClass p2p_prev_ = LinkClass::none, p2p_next_ = LinkClass::none;  // to the stage before / after
};

}  // namespace

Result<bool> check_optimizer_overlap(const Placement& pl, OptimizerOverlap ov) {
  if (ov == OptimizerOverlap::none) return true;
  const std::string flag = std::string("--optimizer-overlap ") + to_string(ov) + ": ";
  if (pl.optim32.tier == Tier::gpu)
    return make_error(flag + "needs the optimizer states off the GPU (the CPU runs Adam while the GPU computes)");
  if (pl.grad16.tier == Tier::gpu)
    return make_error(flag + "needs the gradients offloaded as they are made (grad16 on cpu or nvme), not kept on "
                             "the GPU until backward ends");
  if (ov == OptimizerOverlap::dpu && pl.param16.tier != Tier::gpu)
    return make_error(flag + "the delayed update keeps a copy of the parameters on the GPU that the CPU updates "
                             "behind (param16 on gpu, as ZeRO-Offload)");
  if (pl.layer_major) return make_error(flag + "not with the layer-major l2l schedule");
  return true;
}

Result<Schedule> build_schedule(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                const HardwareProfile& profile, int rank, const MemorySizes& sizes, int stage) {
  Result<Placement> ok = validate(placement);
  if (!ok) return make_error(ok.error());
  Result<TrainingConfig> cfg = validate_ranges(config, model.layers);
  if (!cfg) return make_error(cfg.error());
  if (stage >= 0 && stage < std::max(1, config.pp)) {  // the size of what is built: this stage's blocks
    const StageBlocks sb = stage_blocks(model.layers, std::max(1, config.pp), stage);
    cfg = schedule_size_check(config, std::max(1, sb.last - sb.first), machine_memory_bytes());
    if (!cfg) return make_error(cfg.error());
  }
  if (config.mp > profile.gpus_per_node)
    return make_error("--mp: tensor slicing stays inside a node of " + std::to_string(profile.gpus_per_node) +
                      " GPUs, got " + std::to_string(config.mp));
  Result<int> resolved = resolve_dp(config, profile);
  if (!resolved) return make_error(resolved.error());
  const int dp = *resolved;
  if (rank < 0 || rank >= dp)
    return make_error("--rank: expected 0.." + std::to_string(dp - 1) + ", got " + std::to_string(rank));
  if (stage < 0 || stage >= std::max(1, config.pp))
    return make_error("--stage: expected 0.." + std::to_string(std::max(1, config.pp) - 1) + ", got " +
                      std::to_string(stage));
  if (config.pp > 1 && placement.layer_major)
    return make_error("--pp: the layer-major l2l schedule relays every layer through one GPU; no pipeline stages");
  if (config.micro_batches > 1 && !placement.layer_major)
    return make_error("--micro-batches: only the layer-major l2l schedule loops over micro-batches inside an iteration");
  if (placement.act_ckpt.partitioned && config.mp <= 1)
    return make_error("act_ckpt: partitioned checkpoints are split across the tensor-slicing ranks (DeepSpeed's "
                      "partition_activations); with mp 1 there is nothing to split (partitioned: false, or --mp > 1)");
  if (!(sizes.param_bytes > 0) || !(sizes.optim_bytes > 0) || !(sizes.act_bytes > 0))
    return make_error("schedule: bytes per parameter, optimizer state and activation must be > 0");
  if (Result<bool> ok = check_optimizer_overlap(placement, config.optimizer_overlap); !ok) return make_error(ok.error());
  TrainingConfig resolved_config = config;
  resolved_config.dp = dp;
  return Generator(model, placement, resolved_config, profile, rank, dp, sizes, stage).run();
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
  // Buffers: made once, read only while alive, given back once.
  std::map<std::string, int> live;  // name -> step that made it
  for (const Step& st : s.steps) {
    for (const Buffer& b : st.allocs) {
      if (!(b.bytes >= 0)) fail(st, "buffer " + b.name + " has no size");
      if (!live.emplace(b.name, st.id).second) fail(st, "makes buffer " + b.name + ", which already exists");
    }
    for (const std::string* name : {&st.src_buf, &st.dst_buf})
      if (!name->empty() && !live.count(*name)) fail(st, "uses buffer " + *name + ", which does not exist");
    for (const std::string& name : st.frees)
      if (!live.erase(name)) fail(st, "gives back buffer " + name + ", which does not exist");
  }
  for (const auto& [name, step] : live)
    if (bad.size() < 20) bad.push_back("buffer " + name + ": made at step " + std::to_string(step) + " but never given back");
  // The optimizer overlap's rules.
  int first_compute = -1, last_compute = -1;
  for (const Step& st : s.steps)
    if (st.kind == StepKind::compute) {
      if (first_compute < 0) first_compute = st.id;
      last_compute = st.id;
    }
  for (const Step& st : s.steps) {
    const bool cpu_update = st.kind == StepKind::optimizer && st.src == Tier::cpu;
    if (cpu_update && s.optimizer_overlap != OptimizerOverlap::dpu && st.deps.empty())
      fail(st, "an update that waits for no gradient");
    if (s.optimizer_overlap != OptimizerOverlap::dpu) continue;
    if (cpu_update && st.id > first_compute) fail(st, "dpu: the delayed update must come before the first compute");
    if (st.kind == StepKind::fetch && st.op == "params" && st.hop == "cg" &&
        std::find(st.deps.begin(), st.deps.end(), last_compute) == st.deps.end())
      fail(st, "dpu: the updated parameters may reach the GPU only after the last compute");
  }
  return bad;
}

std::vector<double> buffer_bytes_by_step(const Schedule& s, Tier tier) {
  std::vector<double> out;
  out.reserve(s.steps.size());
  std::map<std::string, double> live;
  double now = 0;
  for (const Step& st : s.steps) {
    for (const Buffer& b : st.allocs)
      if (b.tier == tier) {
        live[b.name] = b.bytes;
        now += b.bytes;
      }
    out.push_back(now);
    for (const std::string& name : st.frees)
      if (auto it = live.find(name); it != live.end()) {
        now -= it->second;
        live.erase(it);
      }
  }
  return out;
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
    if (st.accum_step >= 0) op += " acc" + std::to_string(st.accum_step);
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
