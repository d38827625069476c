#include "planner/fit.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "model/units.hpp"

namespace memwall::planner {
namespace {

// Time to move `bytes` at `bw`; a missing bandwidth (0) means the path does not exist here.
double transfer_s(double bytes, double bw) {
  if (bytes <= 0) return 0;
  return bw > 0 ? bytes / bw : INFINITY;
}

// Seconds per parameter element of each hop of a fetch (0: the hop is not taken), and of a
// backward group's gradient on the links the next group's fetch also takes.
struct FetchCost {
  double hop[3] = {0, 0, 0};  // nc (NVMe -> CPU), cg (CPU -> GPU), gg (all-gather), as run_items numbers them
  double grad_cg = 0, grad_gg = 0;  // the gradient's offload to CPU, its reduce-scatter
  double gg_latency = 0;  // one all-gather's or reduce-scatter's steps' latencies, whatever its bytes
};

// What the parameter fetches of a compute list leave exposed behind its computes, per prefetch
// window (run_items in model/schedule_fetch.cpp, Sec. 6.2: before the i-th group's first compute,
// nc, cg and gg are issued for groups i + d, i + d - 1 and i + d - 2), over one pass that repeats
// one block's `items` (a segment's recompute and backward are each taken as repeating their
// block: the windows of the groups where one meets the other are left out, a LayerNorm's or a
// projection's). In backward each group's gradient leaves after it. A group's first hop starts
// once the compute two items before the group it was issued at is done, and the group's hops must
// all have arrived by its own first compute: what does not fit in the computes between is
// exposed. An all-gather shares its link with the next group's when that one starts before it is
// done, and in backward with the previous group's gradient leaving. Each group's exposure counts
// once: a group whose fetch was late made the computes after it wait too. The whole-iteration
// bound (traffic against compute) misses this at small micro-batches: fc1's all-gather has only
// the residual add and LayerNorm before it to hide behind (table1-10B zero3 bsz 2 on one DGX-2
// replays at 3.56 s where the bound said 2.90).
double window_exposed_s(const std::vector<PassItem>& items, bool backward, const FetchCost& fc, int depth) {
  const long n = long(items.size());
  std::vector<double> before(size_t(n) + 1, 0);  // compute seconds before item k of the period
  std::vector<long> first;                       // the items that start a group
  for (long k = 0; k < n; ++k) {
    before[size_t(k) + 1] = before[size_t(k)] + items[size_t(k)].seconds;
    if (items[size_t(k)].param_elems > 0) first.push_back(k);
  }
  const long groups = long(first.size());
  if (groups == 0) return 0;
  auto floor_div = [](long a, long b) { return a >= 0 ? a / b : -((b - 1 - a) / b); };
  // compute seconds before item x of the repeated list (x may fall in an earlier period)
  auto at = [&](long x) {
    const long q = floor_div(x, n);
    return double(q) * before[size_t(n)] + before[size_t(x - q * n)];
  };
  auto start = [&](long j) { const long q = floor_div(j, groups); return first[size_t(j - q * groups)] + q * n; };
  const long ahead[3] = {depth, std::max(depth - 1, 0), std::max(depth - 2, 0)};
  double exposed = 0;
  for (long j = 0; j < groups; ++j) {
    const long k = first[size_t(j)];
    const double elems = items[size_t(k)].param_elems;
    double chain = 0;
    int first_hop = -1;
    for (int h = 0; h < 3; ++h)
      if (fc.hop[h] > 0) {
        chain += fc.hop[h] * elems;
        if (first_hop < 0) first_hop = h;
      }
    if (first_hop < 0) return 0;
    if (fc.hop[2] > 0) chain += fc.gg_latency;
    if (first_hop == 2) {
      // The next group's all-gather starts once the compute two items before its own issue point
      // is done, often before this one has arrived: the two share the link until one is done
      // (fc1's and fc2's, both issued around ln2: each takes twice its time alone).
      const double alone = chain;
      const long next = start(j + 1 - ahead[2]) - 1, mine = start(j - ahead[2]) - 1;
      const double lead = at(next) - at(mine);  // how long this one runs alone
      const long nk = start(j + 1);
      const double next_s = fc.hop[2] * items[size_t(nk - floor_div(nk, n) * n)].param_elems + fc.gg_latency;
      chain += std::max(0.0, std::min(alone - lead, next_s));
    }
    // the previous group's gradient, leaving in this window on the same links
    if (backward) {
      const long prev = start(j - 1);
      const double g = items[size_t(prev - floor_div(prev, n) * n)].param_elems;
      if (fc.hop[2] > 0 && fc.grad_gg > 0) chain += fc.grad_gg * g + fc.gg_latency;
      if (fc.hop[1] > 0) chain += fc.grad_cg * g;
    }
    const double window = at(start(j)) - at(start(j - ahead[first_hop]) - 1);
    exposed += std::max(0.0, chain - window);
  }
  return exposed;
}

}  // namespace

const char* to_string(Resource r) {
  switch (r) {
    case Resource::gpu_memory: return "GPU memory";
    case Resource::gpu_largest_alloc: return "largest GPU allocation";
    case Resource::cpu_memory: return "CPU memory";
    case Resource::pinned: return "pinned memory";
    case Resource::nvme: return "NVMe";
  }
  return "?";
}

const char* resource_key(Resource r) {
  switch (r) {
    case Resource::gpu_memory: return "gpu_memory";
    case Resource::gpu_largest_alloc: return "gpu_largest_alloc";
    case Resource::cpu_memory: return "cpu_memory";
    case Resource::pinned: return "pinned";
    case Resource::nvme: return "nvme";
  }
  return "?";
}

std::string LimitCheck::sentence() const {
  // Decimal units for node-level storage (as datasheets give it), binary for GPU memory.
  auto fmt = [&](double b) { return scope == std::string("per GPU") ? format_bytes(b) : format_bytes_decimal(b); };
  if (fits()) return std::string(to_string(resource)) + " " + fmt(needed_bytes) + " of " + fmt(capacity_bytes) + " " + scope;
  std::string out = std::string(to_string(resource)) + " " + fmt(capacity_bytes) + " < " + fmt(needed_bytes) + " needed " + scope;
  if (fmt(capacity_bytes) == fmt(needed_bytes)) out += " (short by " + fmt(shortfall_bytes()) + ")";
  return out;
}

bool FitReport::fits() const {
  for (const auto& c : checks)
    if (!c.fits()) return false;
  return true;
}

const LimitCheck& FitReport::binding() const {
  size_t best = 0;
  for (size_t i = 1; i < checks.size(); ++i)
    if (checks[i].use() > checks[best].use()) best = i;
  return checks[best];
}

double embedding_params(const ModelSpec& m) { return embed_param_elems(m, m.seq); }

double largest_partition_elems(const ModelSpec& m, const Candidate& c, State s) {
  const TrainingConfig& k = c.config;
  const double fc1 = mswm_bytes(m) / 4.0 / k.mp / k.tiling_factor;  // Eq. 4 is 4 B x (hd x 4hd)
  const double embed = double(m.vocab) * double(m.hidden) / embedding_mp(k);
  const double whole = std::max(fc1, embed);
  return std::ceil(c.placement.of(s).partitioned ? whole / k.dp : whole);
}

int nodes_used(const TrainingConfig& k, const HardwareProfile& p) {
  return p.nodes_for(long(k.dp) * k.mp * std::max(1, k.pp));
}

FitReport check_fit(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const FitOptions& o) {
  const TrainingConfig& k = c.config;
  const Placement& pl = c.placement;
  const double mp = k.mp, t = k.tiling_factor;
  const int pp = std::max(1, k.pp);
  const int ranks = ranks_sharing_node(k, p);
  FitReport r;

  // One rank of the stage that holds the most on each tier (fullest_stages: the first, the last or
  // one between): the memory model (model/memory.hpp), whose peaks are the schedule's.
  const FullestStages fs = fullest_stages(m, pl, k, p);
  auto stage_words = [&](Tier t) -> std::string {
    if (pp == 1 || !o.words) return "";
    const int s = fs.stage[size_t(t)];
    return s == 0        ? " (first pipeline stage)"
           : s == pp - 1 ? " (last pipeline stage)"
                         : " (pipeline stage " + std::to_string(s) + " of " + std::to_string(pp) + ")";
  };
  auto parts_of = [&](const TierMemory& tm, double scale = 1) {
    std::vector<Part> out;
    if (o.words)
      for (const MemoryPart& part : tm.parts) out.push_back({part.what, part.bytes * scale});
    return out;
  };
  auto moment_of = [&](const TierMemory& tm, Tier t) { return o.words ? tm.moment + stage_words(t) : std::string(); };

  // ---- one GPU ----
  const TierMemory& g = fs.of(Tier::gpu).of(Tier::gpu);
  LimitCheck gpu{Resource::gpu_memory, "per GPU", g.peak_bytes, p.gpu_memory_bytes, parts_of(g), moment_of(g, Tier::gpu)};
  // what the software stack keeps beside memwall's bytes (gpu.reserve): counted as needed, so the
  // sentence compares with the whole GPU the profile names
  if (const double reserve = gpu_reserve_bytes(k, p); reserve > 0) {
    gpu.needed_bytes += reserve;
    if (o.words) gpu.parts.push_back({"framework reserve (gpu.reserve: " + describe_gpu_reserve(k, p) + ")", reserve});
  }
  r.checks.push_back(std::move(gpu));

  if (o.max_alloc_bytes > 0) {
    // Only the transformer blocks' tensors: memory-centric tiling splits their linear weights
    // (Sec. 5.1.3); the embedding is outside the paper's one-layer experiment (Table 5 counts
    // 12 hd^2 parameters only).
    const double mswm = mswm_bytes(m) / mp / t;
    LimitCheck big{Resource::gpu_largest_alloc, "per GPU", 0, o.max_alloc_bytes, {}, ""};
    big.parts.push_back({"fc1 weight tile, fp16 (Eq. 4 / 2 / tiling)", mswm / 2});
    double fc1_out = 0;  // fc1's outputs per token (4hd for the paper's GPT; every active expert's)
    for (const BlockParamOp& op : block_param_ops(m))
      if (op.role == OpRole::fc1) fc1_out = op.active * double(op.out);
    big.parts.push_back({"fc1 output activation, fp16", 2.0 * k.bsz * double(k.seq) * fc1_out / mp});
    big.parts.push_back({"attention scores, fp16", 2.0 * k.bsz * (m.heads / mp) * double(k.seq) * double(k.seq) *
                                                       attention_share(m, k.seq, k.what_if.attention_density)});
    for (const Part& part : big.parts) big.needed_bytes = std::max(big.needed_bytes, part.bytes);
    r.checks.push_back(std::move(big));
  }

  // ---- CPU memory, its pinned buffers and NVMe of one node: its ranks' ----
  const MemoryModel& cm = fs.of(Tier::cpu);
  const TierMemory& h = cm.of(Tier::cpu);
  r.checks.push_back({Resource::cpu_memory, "per node", h.peak_bytes * ranks, p.cpu_memory_bytes, parts_of(h, ranks),
                      moment_of(h, Tier::cpu)});
  // what the executor pins: every CPU buffer of the schedule (its admission check asks the same)
  LimitCheck pinned{Resource::pinned, "per node", cm.cpu_buffer_bytes * ranks, p.pinned_budget_bytes, {},
                    o.words ? h.moment : std::string()};
  if (o.words)
    for (size_t i = h.parts.size() - h.buffer_parts; i < h.parts.size(); ++i)
      pinned.parts.push_back({h.parts[i].what, h.parts[i].bytes * ranks});
  r.checks.push_back(std::move(pinned));
  const TierMemory& n = fs.of(Tier::nvme).of(Tier::nvme);
  r.checks.push_back({Resource::nvme, "per node", n.peak_bytes * ranks, p.nvme_capacity_bytes, parts_of(n, ranks), ""});
  return r;
}

// One block's graph per (bsz, seq, attention density), and with (mp, tiling, vocabulary split) its
// cost: the search asks for a few hundred of them, each hundreds of times (a hashed lookup).
struct TimeFacts::Passes {
  using Shape = std::tuple<double, long, double>;
  using Key = std::tuple<double, long, double, int, int, bool>;
  struct Hash {
    size_t operator()(const Key& k) const {
      size_t h = std::hash<double>{}(std::get<0>(k));
      for (size_t x : {std::hash<long>{}(std::get<1>(k)), std::hash<double>{}(std::get<2>(k)),
                       size_t(std::get<3>(k)), size_t(std::get<4>(k)) << 8, size_t(std::get<5>(k)) << 20})
        h = h * 1000003 ^ x;
      return h;
    }
  };
  std::mutex mu;
  std::map<Shape, OperatorGraph> graphs;
  std::unordered_map<Key, PassCompute, Hash> made;
  using WindowKey = std::tuple<Key, std::array<double, 6>, int>;
  struct WindowHash {
    size_t operator()(const WindowKey& k) const {
      size_t h = Hash{}(std::get<0>(k)) ^ size_t(std::get<2>(k));
      for (double x : std::get<1>(k)) h = h * 1000003 ^ std::hash<double>{}(x);
      return h;
    }
  };
  std::unordered_map<WindowKey, double, WindowHash> windows;
};

double TimeFacts::optimizer_params(const ModelSpec& m, const Placement& pl, const TrainingConfig& c) const {
  double most = 0;
  for (int s = 0; s < std::max(1, c.pp); ++s) most = std::max(most, kept_state_elems(m, c, s, pl, pl.optim32));
  return most;
}

const PassCompute& TimeFacts::pass(const ModelSpec& m, const HardwareProfile& p, const TrainingConfig& c) const {
  const Passes::Shape shape{c.bsz, c.seq, c.what_if.attention_density};
  const Passes::Key key = std::tuple_cat(shape, std::tuple{c.mp, c.tiling_factor, c.embedding_replicated});
  std::lock_guard lock(passes_->mu);
  auto [it, fresh] = passes_->made.try_emplace(key);
  if (fresh) {
    auto g = passes_->graphs.find(shape);
    if (g == passes_->graphs.end()) g = passes_->graphs.emplace(shape, block_graph(m, c)).first;
    it->second = pass_compute(p, m, c, peak, g->second);
  }
  return it->second;
}

double TimeFacts::block_windows_s(const ModelSpec& m, const HardwareProfile& p, const TrainingConfig& c,
                                  const std::array<double, 6>& cost) const {
  const Passes::Key key = std::tuple_cat(std::tuple{c.bsz, c.seq, c.what_if.attention_density},
                                         std::tuple{c.mp, c.tiling_factor, c.embedding_replicated});
  const std::tuple whole{key, cost, c.prefetch_depth};
  {
    std::lock_guard lock(passes_->mu);
    if (auto it = passes_->windows.find(whole); it != passes_->windows.end()) return it->second;
  }
  const PassCompute& pc = pass(m, p, c);
  FetchCost fc;
  for (int h = 0; h < 3; ++h) fc.hop[h] = cost[size_t(h)];
  fc.grad_cg = cost[3], fc.grad_gg = cost[4], fc.gg_latency = cost[5];
  const double s = window_exposed_s(pc.forward, false, fc, c.prefetch_depth) +
                   window_exposed_s(pc.recompute, false, fc, c.prefetch_depth) +
                   window_exposed_s(pc.backward, true, fc, c.prefetch_depth);
  std::lock_guard lock(passes_->mu);
  passes_->windows.emplace(whole, s);
  return s;
}

TimeFacts TimeFacts::of(const ModelSpec& m, const HardwareProfile& p) {
  TimeFacts f;
  f.params = analysis_param_count(m);
  f.active_params = analysis_param_count(m, true);
  f.routed = active_weight_share(m);
  f.peak = p.peak_flops_per_s(m.hidden);
  f.block_weights = active_block_weight_elems(m);
  f.passes_ = std::make_shared<Passes>();
  return f;
}

TierBandwidths TierBandwidths::of(const std::vector<StateTierEfficiency>& eff) {
  TierBandwidths b;
  std::array<std::array<bool, kPaths>, 3> seen{};
  for (const StateTierEfficiency& e : eff) {
    const Path path = e.tier == "gpu" ? gpu : e.tier == "cpu" ? cpu : e.tier == "nvme" ? nvme
                    : e.tier == "cpu-broadcast" ? cpu_broadcast : kPaths;
    if (path == kPaths || seen[size_t(e.state)][size_t(path)]) continue;  // the first of a state and tier
    seen[size_t(e.state)][size_t(path)] = true;
    b.bps[size_t(e.state)][size_t(path)] = e.bw_Bps;
  }
  return b;
}

MicroStep micro_step_compute(const ModelSpec& m, const TrainingConfig& k, const PassCompute& pc) {
  const int pp = std::max(1, k.pp), v = pp > 1 ? std::max(1, k.virtual_stages) : 1;
  MicroStep out{m.layers * pc.block_s + pc.outer_s, m.layers};
  if (pp == 1) return out;
  out.compute_s = 0;
  for (int s = 0; s < pp; ++s) {
    const int blocks = stage_block_count(m.layers, pp, v, s);
    const double t = blocks * pc.block_s + (s == 0 ? pc.embed_s : 0) + (s == pp - 1 ? pc.outer_s - pc.embed_s : 0);
    if (t > out.compute_s) out.compute_s = t, out.stage_blocks = blocks;
  }
  return out;
}

double compute_floor_per_sample(const ModelSpec& m, const HardwareProfile& p, const TrainingConfig& k,
                                const TimeFacts& f) {
  return compute_floor_per_sample(m, k, f.pass(m, p, k));
}

double compute_floor_per_sample(const ModelSpec& m, const TrainingConfig& k, const PassCompute& pc) {
  double compute_s = micro_step_compute(m, k, pc).compute_s;
  if (const int ga = std::max(1, k.grad_accum); ga > 1) compute_s *= ga;  // as estimate_time scales it
  return compute_s / global_batch(k);
}

TimeBreakdown estimate_time(const ModelSpec& m, const Candidate& c, const HardwareProfile& p,
                            const std::vector<StateTierEfficiency>& eff) {
  return estimate_time(m, c, p, TimeFacts::of(m, p),
                       TierBandwidths::of(eff.empty() ? tier_efficiencies(p, m, c.config, c.config.dp) : eff));
}

TimeBreakdown estimate_time(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const TimeFacts& f,
                            const TierBandwidths& bws) {
  TimeBreakdown tb;
  estimate_times(m, c.placement, c.config, p, f, bws, std::span(&c.config.optimizer_overlap, 1), std::span(&tb, 1));
  return tb;
}

bool estimate_times(const ModelSpec& m, const Placement& pl, const TrainingConfig& k, const HardwareProfile& p,
                    const TimeFacts& f, const TierBandwidths& bws, std::span<const OptimizerOverlap> overlaps,
                    std::span<TimeBreakdown> out, double bound, const PassCompute* pass) {
  using P = TierBandwidths::Path;
  auto tier_path = [](Tier t) { return t == Tier::gpu ? P::gpu : t == Tier::cpu ? P::cpu : P::nvme; };
  const double dp = k.dp, mp = k.mp, ga = std::max(1, k.grad_accum), pp = std::max(1, k.pp);
  // one micro-step of one GPU without slicing, then of one tensor slice of one pipeline stage
  const double flops_model = computation_flops_eq7(k.bsz, k.seq, f.active_params) / pp;
  const double flops_gpu = flops_model / mp;
  TimeBreakdown tb;
  // every operator of a block and around the blocks, at its own shape and rate (op_step_seconds:
  // linear layers by GEMM shape, tensor-sliced and tiled; attention products and elementwise
  // operators at their FLOPs or their bytes through HBM), as the simulator costs them. Pipeline
  // stages hold whole blocks (stage_chunks: 50 blocks over 4 stages are 12 or 13, over 4 x 2 chunks
  // 12 to 14), the embedding on the first and the final norm and LM head on the last; the slowest
  // stage sets the pace of every micro-step.
  const PassCompute& pc = pass ? *pass : f.pass(m, p, k);  // held by the cache: its nodes never move
  const int v = pp > 1 ? std::max(1, k.virtual_stages) : 1;  // chunks per stage (interleaved 1F1B)
  const MicroStep step = micro_step_compute(m, k, pc);
  const int stage_blocks = step.stage_blocks;
  tb.compute_s = step.compute_s;
  // Eq. 9: parameters cross three times (forward, recompute, backward), gradients once; a mixture
  // of experts moves every expert's for the routed share's FLOPs
  const double routed = f.routed;
  const double pg_bytes = flops_gpu / (ait_param_grad_eq9(k.bsz, k.seq) * routed);
  const bool bcast = pl.fetch == ParamFetch::broadcast && k.dp > 1;
  const P host_path = bcast ? P::cpu_broadcast : P::cpu;
  const double gg = bws.of(AitState::param_grad, P::gpu);
  const double share_rest = (dp - 1) / dp;
  // every all-gather and reduce-scatter over the data-parallel ranks waits for its ring's dp - 1
  // steps' latencies besides its bytes (the simulator's collectives): one per parameter group and
  // pass, so a tiled operator's (one per tile) pays it tiles times
  const bool dp_across = long(k.dp) * k.mp > p.gpus_per_node;
  const double gg_latency = k.dp > 1 ? (dp - 1) * p.collective_step_latency_s(dp_across) : 0;
  const double groups = double(pc.param_groups) * stage_blocks;  // parameter groups of one pass over the stage's blocks
  double t_param = 0, t_grad = 0;
  switch (pl.param16.tier) {
    case Tier::gpu:
      if (pl.param16.partitioned && k.dp > 1) {
        tb.collective_latency_s = 3 * groups * gg_latency;
        t_param = transfer_s(0.75 * pg_bytes * share_rest, gg) + tb.collective_latency_s;
      }
      break;
    case Tier::cpu: t_param = transfer_s(0.75 * pg_bytes, bws.of(AitState::param_grad, host_path)); break;
    case Tier::nvme: t_param = transfer_s(0.75 * pg_bytes, bws.of(AitState::param_grad, P::nvme)); break;
  }
  switch (pl.grad16.tier) {
    case Tier::gpu:
      if (k.dp > 1) {
        // 1-bit Adam: 1 bit per fp16 element; the scales (4 B per tensor and peer) are left out here.
        // Whole gradients (all-reduce) accumulate locally and cross once per optimizer step: a
        // share of each micro-step's; partitioned ones are reduce-scattered in every micro-step.
        const double bytes = (pl.grad16.partitioned ? 1.0 : 2.0 / ga) * 0.25 * pg_bytes * share_rest;
        const double latency = pl.grad16.partitioned ? groups * gg_latency : 0;
        tb.collective_latency_s += latency;
        t_grad = transfer_s(k.what_if.onebit_adam ? onebit_bytes(bytes, 2.0, 0) : bytes, gg) + latency;
      }
      // The optimizer runs elsewhere: each rank's gradient share still crosses PCIe to it.
      if (pl.optim32.tier != Tier::gpu)
        t_grad += transfer_s(0.25 * pg_bytes,
                             bws.of(AitState::param_grad, pl.optim32.tier == Tier::nvme ? P::nvme : host_path));
      break;
    case Tier::cpu: t_grad = transfer_s(0.25 * pg_bytes, bws.of(AitState::param_grad, host_path)); break;
    case Tier::nvme: t_grad = transfer_s(0.25 * pg_bytes, bws.of(AitState::param_grad, P::nvme)); break;
  }
  tb.param_grad_s = t_param + t_grad;
  // Eq. 11's checkpoint bytes of the stage's share of the model: every tensor-slicing rank keeps the
  // whole checkpoint (each slice's block input is the whole activation), or with partitioned
  // checkpoints (partition_activations) 1/mp of it
  const bool ckpt_sliced = pl.act_ckpt.partitioned && k.mp > 1;
  if (pl.act_ckpt.tier != Tier::gpu) {
    tb.act_ckpt_s = transfer_s(flops_model / ait_act_ckpt(m, k.ci, f.block_weights) / (ckpt_sliced ? mp : 1),
                               bws.of(AitState::act_ckpt, tier_path(pl.act_ckpt.tier)));
    // Half of them (Eq. 11 counts each checkpoint saved and loaded) come back to the GPU, each just
    // before its segment's recompute: the schedule loads it once the later segment is done with
    // the GPU buffer it takes (load_checkpoints; DeepSpeed's checkpointing moves a CPU checkpoint
    // to the GPU when the recompute asks for it), so nothing hides the loads.
    tb.act_ckpt_load_s = tb.act_ckpt_s / 2;
  }
  // sync_grad_copies: ZeRO-Offload's owners copy their gradients to CPU one rank at a time, each
  // copy holding up the backward (as the schedule does): the whole gradient over one link, unhidden
  const double serial_grad = bcast && k.sync_grad_copies && pl.grad16.tier != Tier::gpu ? t_grad : 0;
  const double serial = serial_grad + tb.act_ckpt_load_s;
  const double overlapped = tb.param_grad_s + tb.act_ckpt_s - serial;
  // fetched on demand, or after a synchronize that waits for every transfer before it (sync_fetches):
  // nothing hides behind the computes
  const bool hidden = k.prefetch_depth > 0 && !k.sync_fetches;
  double exposed_fb = (hidden ? std::max(0.0, overlapped - tb.compute_s) : overlapped) + serial;
  // Eq. 10 against the aggregate bandwidth: every rank updates its partition at once. On NVMe the
  // bytes are the schedule's optimizer phase (MemorySizes): the states read and written without
  // their fp32 gradient, the 16-bit gradient read where it was offloaded to NVMe and the updated
  // 16-bit parameters written where they live on NVMe (Eq. 10 counts the states only).
  if (pl.optim32.tier != Tier::gpu) {
    const MemorySizes z;
    const double nvme_bytes = 2 * z.swapped_optim_bytes() + (pl.grad16.tier == Tier::nvme ? z.param_bytes : 0) +
                              (pl.param16.tier == Tier::nvme ? z.param_bytes : 0);
    const double swapped = pl.optim32.tier == Tier::nvme ? nvme_bytes / (2 * z.optim_bytes) : 1.0;
    const double opt_bytes = swapped * flops_model / (ait_optimizer_eq10(k.bsz, k.seq) * routed);
    const double traffic = transfer_s(opt_bytes, bws.of(AitState::optimizer, tier_path(pl.optim32.tier)));
    const double adam = f.params / (nodes_used(k, p) * p.cpu_adam_params_per_s);
    tb.optimizer_s = std::max(traffic, adam);
    if (pl.param16.tier == Tier::gpu)  // updated fp16 parameters return to the GPU copies
      tb.refresh_s = transfer_s(0.25 * pg_bytes, bws.of(AitState::param_grad, host_path));
  } else {  // Adam on the GPU over the rank's parameters (its shard with ZeRO), through HBM
    tb.optimizer_s = gpu_adam_seconds(p, f.optimizer_params(m, pl, k));
    // ZeRO-1 and -2 (the states partitioned, the 16-bit parameters whole on every rank): each rank
    // updated its shard, and the group all-gathers the parameters after the step, with nothing left
    // to hide it behind (the schedule's post-step all-gather)
    if (pl.optim32.partitioned && pl.param16.tier == Tier::gpu && !pl.param16.partitioned && k.dp > 1)
      tb.param_gather_s = transfer_s(0.25 * pg_bytes * share_rest, gg);
  }
  if (k.mp > 1) {  // forward 2, recompute 2, backward 2 all-reduces of (B, T, C) fp16 per layer of the stage
    double bytes = stage_blocks * 6.0 * 2.0 * (mp - 1) / mp * 2.0 * k.bsz * double(k.seq) * double(m.hidden);
    if (ckpt_sliced)  // and each partitioned checkpoint all-gathered before its segment's recompute
      bytes += std::ceil(double(stage_blocks) / k.ci) * (mp - 1) / mp * 2.0 * k.bsz * double(k.seq) * double(m.hidden);
    tb.mp_allreduce_s = transfer_s(bytes, p.gpu_gpu_Bps);
  }
  if (k.ep > 1 && m.is_moe()) {  // dispatch and combine in forward, recompute and backward per MoE block
    const double send = 2.0 * k.bsz * double(k.seq) * double(m.hidden) * m.moe.experts_per_token;
    const bool across = long(k.ep) * k.mp > p.gpus_per_node && p.inter_node_Bps > 0;
    tb.all_to_all_s = transfer_s(stage_blocks * 6.0 * send * (k.ep - 1) / k.ep, across ? p.inter_node_Bps : p.gpu_gpu_Bps);
  }
  // a stage's activations forward and their gradients back, 1/mp each (Megatron's scatter), once per
  // chunk when interleaved; the last stage's hop to the first crosses nodes once the job does
  if (pp > 1) {
    const bool across = (dp * mp >= p.gpus_per_node || (v > 1 && dp * mp * pp > p.gpus_per_node)) && p.nodes > 1;
    const double bw = across && p.inter_node_Bps > 0 ? p.inter_node_Bps : p.gpu_gpu_Bps;
    tb.p2p_s = transfer_s(v * 2.0 * 2.0 * k.bsz * double(k.seq) * double(m.hidden) / mp, bw);
  }
  // Gradient clipping: the norm of this rank's gradient partition, read once where it lives, between
  // the last gradient and the first update (the schedule's grad_norm step)
  if (k.grad_clip > 0) {
    const double mine = 0.25 * pg_bytes / (pl.optim32.partitioned ? dp : 1.0);
    // every rank of the node reads its part at once: CPU memory is shared, HBM is each GPU's own
    const double rate = pl.grad16.tier == Tier::gpu ? p.gpu_memory_Bps
                                                    : p.cpu_memory_Bps / p.ranks_per_node(long(dp * mp * pp));
    if (pl.grad16.tier != Tier::nvme && rate > 0) tb.grad_norm_s = mine / rate;
  }
  // Everything above is the same whatever the optimizer's overlap and the prefetch windows: each
  // overlap asked takes it from here, with the forward and backward's exposed time.
  const TimeBreakdown shared = tb;
  auto finish = [&](double exposed_fb, OptimizerOverlap overlap) {
    TimeBreakdown t = shared;  // this overlap's
    // The refresh streams chunk by chunk behind CPU Adam (ZeRO-Offload): the longer of the two counts.
    double optimizer_exposed = std::max(t.optimizer_s, t.refresh_s);
    switch (overlap) {
      case OptimizerOverlap::none: break;
      case OptimizerOverlap::backward:  // beside backward and recompute: 3/4 of Eq. 7's computation
        // unless its chunks go through an NVMe that backward's own parameter reads or gradient writes
        // use: the device is shared, and the bulk chunk reads and writes slow the reads the next
        // computes wait for. The replay (fair sharing on the drive) finds no gain there: table1-10B
        // zero_inf_nvme bsz 8 on one DGX-2 takes 25.9 s overlapped against 23.4 s after backward
        // (Overlap.NoGainOnAnNvmeBackwardAlsoUses); so nothing is counted as hidden.
        if (!(pl.optim32.tier == Tier::nvme && (pl.param16.tier == Tier::nvme || pl.grad16.tier == Tier::nvme)))
          optimizer_exposed = std::max(0.0, optimizer_exposed - 0.75 * t.compute_s);
        break;
      case OptimizerOverlap::dpu:  // beside the whole forward and backward; the refresh follows them
        optimizer_exposed = std::max(0.0, t.optimizer_s - t.compute_s) + t.refresh_s;
        break;
    }
    // Gradient accumulation: forward and backward `ga` times, the optimizer once; the backward
    // overlap hides it behind the last micro-step's backward only (the gradients are final there),
    // dpu behind all of them. Pipeline stages (1F1B) idle for pp - 1 micro-steps' time besides,
    // interleaved over v chunks (pp - 1) / v: pipeline_bubble's (pp-1) / (v m + pp - 1) of the step.
    const double micro_step_s = t.compute_s + exposed_fb + t.mp_allreduce_s + t.all_to_all_s + t.p2p_s;
    t.bubble_s = (pp - 1) * micro_step_s / v;
    if (ga > 1) {
      if (overlap == OptimizerOverlap::dpu)
        optimizer_exposed = std::max(0.0, t.optimizer_s - ga * t.compute_s) + t.refresh_s;
      t.compute_s *= ga;
      t.param_grad_s *= ga;
      t.collective_latency_s *= ga;
      t.act_ckpt_s *= ga;
      t.act_ckpt_load_s *= ga;
      t.mp_allreduce_s *= ga;
      t.all_to_all_s *= ga;
      t.p2p_s *= ga;
    }
    t.exposed_s = ga * exposed_fb + optimizer_exposed + t.param_gather_s + t.grad_norm_s + t.mp_allreduce_s +
                   t.all_to_all_s + t.p2p_s + t.bubble_s;
    t.iteration_s = t.compute_s + t.exposed_s;
    t.tflops_per_gpu = ga * flops_gpu / t.iteration_s / 1e12;
    t.samples_per_s = global_batch(k) / t.iteration_s;
    return t;
  };
  // The windows only add to exposed_fb: where every overlap's time without them already exceeds
  // `bound` per sample, they are not made.
  if (std::isfinite(bound)) {
    bool beyond = true;
    for (OptimizerOverlap ov : overlaps) beyond = beyond && finish(exposed_fb, ov).iteration_s / global_batch(k) > bound;
    if (beyond) return false;
  }
  // ... and no less than what the prefetch windows leave exposed, group by group: the slowest
  // stage's blocks forward, its segments' recompute and backward, and the first stage's embedding,
  // fetched before anything computes (l2l's micro-batch loop keeps a layer's parameters for every
  // micro-batch: its windows are not these)
  if (hidden && !pl.layer_major && !(pl.param16.tier == Tier::gpu && !pl.param16.partitioned)) {
    const double pb = MemorySizes{}.param_bytes;
    const bool gathered = k.dp > 1 && (pl.param16.partitioned || bcast);
    const double slice = pl.param16.partitioned && !bcast ? pb / dp : pb;  // bytes per element each rank reads
    FetchCost fc;
    if (pl.param16.tier == Tier::nvme) fc.hop[0] = transfer_s(slice, bws.of(AitState::param_grad, P::nvme));
    if (pl.param16.tier != Tier::gpu) fc.hop[1] = transfer_s(slice, bws.of(AitState::param_grad, host_path));
    if (gathered) fc.hop[2] = transfer_s(bcast ? pb : pb * share_rest, gg);
    fc.gg_latency = gg_latency;
    if (pl.grad16.partitioned && k.dp > 1 && !bcast) fc.grad_gg = transfer_s(pb * share_rest, gg);
    if (pl.grad16.tier != Tier::gpu)
      fc.grad_cg = transfer_s(pl.grad16.partitioned ? pb / dp : pb, bws.of(AitState::param_grad, host_path));
    const double windows_per_block =
        f.block_windows_s(m, p, k, {fc.hop[0], fc.hop[1], fc.hop[2], fc.grad_cg, fc.grad_gg, fc.gg_latency});
    double windows = stage_blocks * windows_per_block;
    if (pp == 1)  // the embedding's fetch opens the forward, with nothing before it to hide behind
      windows += (fc.hop[0] + fc.hop[1] + fc.hop[2]) * pc.embed_param_elems;
    exposed_fb = std::max(exposed_fb, windows + serial);
  }
  for (size_t oi = 0; oi < overlaps.size(); ++oi) out[oi] = finish(exposed_fb, overlaps[oi]);
  return true;
}

}  // namespace memwall::planner
