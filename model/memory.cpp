#include "model/memory.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "model/analysis.hpp"

namespace memwall {
namespace {

// A run of `count` identical parameter groups (the tiles of one operator, or one untiled group) as
// a compute list (forward, or backward with its recomputes) fetches them.
struct Group {
  double bytes = 0;  // whole 16-bit parameters of one group on this rank (tensor-sliced)
  const char* op = "";
  int block = -1;
  int count = 1;     // tiles (> 1: memory-centric tiling, in tile order forward and reversed backward)
  bool backward = false;  // a backward compute: it makes the group's gradient
  bool lm_head = false;   // the tied LM head (its parameters and gradient are the embedding's)
  bool embed_backward = false;  // the embedding's backward
  int ckpts = 0;          // checkpoints of this micro-step on the GPU while it runs (kept: 1/mp when partitioned)
  double act = 0;         // activation working memory while it runs
  bool evaluate = true;   // a moment the prediction takes (false: only seen by earlier windows)
  int whole = 0;          // partitioned checkpoints all-gathered whole for this segment's recompute
  bool expert = false;    // routed experts under expert parallelism: partitioned over dp / ep ranks
  int loop = -1;          // l2l: the micro-batch loop it runs in (a block forward, a segment's recompute
                          // and backward, the head, the tail), whose groups stay until its last micro-batch
};

std::string part_words(State s, const StatePlacement& sp, bool broadcast) {
  std::string out = to_string(s);
  if (!sp.partitioned) return out + " (whole copy)";
  return out + (broadcast ? " (the units this rank owns)" : " (1/dp shard)");
}

}  // namespace

namespace {
// Visits the units of param_units in forward order without naming them: f(role, block, tile, elems,
// expert) with role embed, ln_f or a block's operator, block -1 outside blocks, tile -1 untiled; a
// mixture of experts' fc1 and fc2 are one unit per expert (and tile), tile = expert x tiling + tile:
// with expert parallelism (ep > 1) this rank's E / ep routed experts (`expert`: partitioned over
// the dp / ep ranks holding the same experts) and then the shared ones.
int local_copies(const ModelSpec& m, const TrainingConfig& c, const BlockParamOp& op) {
  return copies_held(m, c, op.copies);
}
template <typename F>
void visit_units(const ModelSpec& m, const TrainingConfig& c, int stage, F f) {
  const int pp = std::max(1, c.pp);
  const int t = std::max(1, c.tiling_factor), ep = std::max(1, c.ep);
  // the token (and learned position) embeddings; a tied LM head's weight is the token embedding's,
  // on the last stage too
  if (stage == 0 || (stage == pp - 1 && m.tied_embeddings))
    f(OpRole::embed, -1, -1, mp_param_elems(OpRole::embed, false, embed_param_elems(m, c.seq), 0, c), false);
  const BlockParamOps ops = block_param_ops(m);
  for (const StageBlocks& sb : stage_chunks(m.layers, pp, c.virtual_stages, stage))
    for (int b = sb.first; b < sb.last; ++b)
      for (const BlockParamOp& op : ops) {
        const int per = op.linear ? t : 1;
        const int n = per * local_copies(m, c, op);
        const double each = mp_param_elems(op.role, op.linear, op.elems, op.bias * op.copies, c) / (per * op.copies);
        const int routed = op.copies > 1 && ep > 1 ? per * m.moe.experts / ep : 0;
        if (!op.linear) f(op.role, b, -1, op.elems, false);
        else if (n == 1) f(op.role, b, -1, each, routed > 0);  // one expert here (ep = experts) or a dense layer
        else
          for (int k = 0; k < n; ++k) f(op.role, b, k, each, k < routed);
      }
  if (stage == pp - 1) f(OpRole::ln_f, -1, -1, norm_param_elems(m), false);
  if (stage == pp - 1 && !m.tied_embeddings)
    f(OpRole::lm_head, -1, -1, mp_param_elems(OpRole::lm_head, false, head_param_elems(m), 0, c), false);
}
// The broadcast variant's owner of the unit [at, at + elems) of `total` elements.
int unit_owner(double at, double elems, double total, int dp) {
  return std::min(dp - 1, int(std::floor(dp * (at + elems / 2) / total)));
}
}  // namespace

double mp_param_elems(OpRole role, bool linear, double elems, double bias, const TrainingConfig& c) {
  const double mp = std::max(1, c.mp);
  if (role == OpRole::embed || role == OpRole::lm_head) return elems / embedding_mp(c);
  if (!linear) return elems;
  if (role == OpRole::proj || role == OpRole::fc2) return (elems - bias) / mp + bias;
  return elems / mp;
}

namespace {
std::string tile_suffix(int tile, int copies, int tiling) {
  tiling = std::max(1, tiling);
  if (tile < 0) return "";
  if (copies <= 1) return "[tile " + std::to_string(tile) + "]";
  return "[expert " + std::to_string(tile / tiling) + (tiling > 1 ? " tile " + std::to_string(tile % tiling) : "") + "]";
}
}  // namespace

std::string unit_name(OpRole role, int block, int tile, int copies, int tiling) {
  std::string n = op_name(role, block) + tile_suffix(tile, copies, tiling);
  return n;
}

std::vector<ParamUnit> param_units(const ModelSpec& m, const TrainingConfig& c, int stage) {
  std::vector<ParamUnit> out;
  std::map<OpRole, int> copies;
  for (const BlockParamOp& op : block_param_ops(m)) copies[op.role] = op.copies;
  visit_units(m, c, stage, [&](OpRole role, int block, int tile, double elems, bool expert) {
    const int n = block >= 0 ? copies[role] : 1;
    out.push_back({unit_name(role, block, tile, n, c.tiling_factor), role, block, tile, elems, expert});
  });
  return out;
}

std::vector<int> broadcast_owners(const std::vector<ParamUnit>& units, int dp) {
  double total = 0, at = 0;
  for (const ParamUnit& u : units) total += u.elems;
  std::vector<int> out;
  out.reserve(units.size());
  for (const ParamUnit& u : units) {
    out.push_back(unit_owner(at, u.elems, total, dp));
    at += u.elems;
  }
  return out;
}

Result<bool> check_expert_parallel(const ModelSpec& m, const Placement& pl, const TrainingConfig& c) {
  if (c.ep <= 1) return true;
  if (!m.is_moe())
    return make_error("--ep: expert parallelism splits a mixture of experts' experts over ranks; " + m.name +
                      " has no experts (use --ep 1)");
  if (m.moe.experts % c.ep != 0)
    return make_error("--ep: expected a divisor of the model's " + std::to_string(m.moe.experts) + " experts, got " +
                      std::to_string(c.ep));
  if (c.dp > 0 && c.dp % c.ep != 0)
    return make_error("--ep: expected a divisor of dp " + std::to_string(c.dp) + ", got " + std::to_string(c.ep));
  if (pl.fetch == ParamFetch::broadcast)
    return make_error("--ep: the broadcast fetch (ZeRO-Offload) with expert parallelism is not modelled; use an "
                      "all-gather placement (zero3, zero_inf_cpu, zero_inf_nvme) or --ep 1");
  if (!pl.param16.partitioned && pl.optim32.partitioned)
    return make_error("--ep: whole 16-bit parameters beside partitioned optimizer states (ZeRO-1/2) all-gather "
                      "the updated parameters over dp, which expert parallelism splits; not modelled: partition "
                      "param16 too (zero3) or use --ep 1");
  return true;
}

int copies_held(const ModelSpec& m, const TrainingConfig& c, int copies) {
  if (copies <= 1 || c.ep <= 1) return copies;
  return copies - m.moe.experts + m.moe.experts / c.ep;
}

int ranks_sharing_node(const TrainingConfig& c, const HardwareProfile& p) {
  return p.ranks_per_node(long(std::max(1, c.dp)) * std::max(1, c.mp) * std::max(1, c.pp));
}

int communicators_per_rank(const TrainingConfig& c) {
  return int(c.dp > 1) + int(c.mp > 1) + int(c.pp > 1);
}

double gpu_reserve_bytes(const TrainingConfig& c, const HardwareProfile& p) {
  const GpuReserve& g = p.gpu_reserve;
  return g.context_bytes + g.workspace_bytes + communicators_per_rank(c) * g.communicator_bytes;
}

std::string describe_gpu_reserve(const TrainingConfig& c, const HardwareProfile& p) {
  const GpuReserve& g = p.gpu_reserve;
  if (!g.given) return "";
  const int n = communicators_per_rank(c);
  std::string out = "context " + format_bytes(g.context_bytes) + " + workspace " + format_bytes(g.workspace_bytes);
  if (n > 0 && g.communicator_bytes > 0)
    out += " + " + std::to_string(n) + " communicator" + (n > 1 ? "s" : "") + " x " + format_bytes(g.communicator_bytes);
  return out;
}

std::array<double, kTiers> capacity_per_rank(const TrainingConfig& c, const HardwareProfile& p) {
  const int sharing = ranks_sharing_node(c, p);
  return {p.gpu_memory_bytes - gpu_reserve_bytes(c, p), p.cpu_memory_bytes / sharing, p.nvme_capacity_bytes / sharing};
}

double pinned_per_rank(const TrainingConfig& c, const HardwareProfile& p) {
  return p.pinned_budget_bytes / ranks_sharing_node(c, p);
}

double kept_param_elems(const std::vector<ParamUnit>& units, const Placement& pl, const StatePlacement& sp, int dp,
                        int rank, int ep) {
  double n = 0;
  for (const ParamUnit& u : units) n += u.elems;
  if (!sp.partitioned || dp <= 1) return n;
  if (pl.fetch != ParamFetch::broadcast) {
    double kept = 0;  // an expert's units over the dp / ep ranks holding that expert
    for (const ParamUnit& u : units) kept += u.elems / (u.expert ? std::max(1, dp / std::max(1, ep)) : dp);
    return kept;
  }
  const std::vector<int> owner = broadcast_owners(units, dp);
  double mine = 0;
  for (size_t i = 0; i < units.size(); ++i)
    if (owner[i] == rank) mine += units[i].elems;
  return mine;
}

// kept_param_elems without naming the units unless the broadcast variant needs them: the sum of
// param_units' elements in closed form (a block: its norms whole, its linear layers sliced by mp).
double kept_state_elems(const ModelSpec& m, const TrainingConfig& c, int stage, const Placement& pl,
                        const StatePlacement& sp, int rank) {
  const int dp = std::max(1, c.dp), pp = std::max(1, c.pp);
  if (sp.partitioned && dp > 1 && pl.fetch == ParamFetch::broadcast) {
    double total = 0, at = 0, mine = 0;
    visit_units(m, c, stage, [&](OpRole, int, int, double e, bool) { total += e; });
    visit_units(m, c, stage, [&](OpRole, int, int, double e, bool) {
      if (unit_owner(at, e, total, dp) == rank) mine += e;
      at += e;
    });
    return mine;
  }
  const int nb = stage_block_count(m.layers, pp, c.virtual_stages, stage);
  const int ep = std::max(1, c.ep);
  double block = 0, expert = 0;  // with ep > 1: this rank's routed experts, apart
  for (const BlockParamOp& op : block_param_ops(m)) {
    const double each = mp_param_elems(op.role, op.linear, op.elems, op.bias * op.copies, c) / op.copies;
    if (op.copies > 1 && ep > 1) {
      expert += each * m.moe.experts / ep;
      block += each * (op.copies - m.moe.experts);
    } else {
      block += each * op.copies;
    }
  }
  double n = nb * block;
  if (stage == 0 || (stage == pp - 1 && m.tied_embeddings))
    n += mp_param_elems(OpRole::embed, false, embed_param_elems(m, c.seq), 0, c);
  if (stage == pp - 1) n += norm_param_elems(m) + mp_param_elems(OpRole::lm_head, false, head_param_elems(m), 0, c);
  const double e = nb * expert;
  if (!sp.partitioned || dp <= 1) return n + e;
  return n / dp + e / std::max(1, dp / ep);
}

std::array<std::array<double, 4>, kTiers> persistent_state_bytes(const ModelSpec& m, const Placement& pl,
                                                                const TrainingConfig& c, int rank,
                                                                const MemorySizes& z, int stage) {
  std::array<std::array<double, 4>, kTiers> out{};
  out[int(pl.param16.tier)][int(State::param16)] += z.param_bytes * kept_state_elems(m, c, stage, pl, pl.param16, rank);
  out[int(pl.grad16.tier)][int(State::grad16)] += z.param_bytes * kept_state_elems(m, c, stage, pl, pl.grad16, rank);
  const double optim = kept_state_elems(m, c, stage, pl, pl.optim32, rank);
  out[int(pl.optim32.tier)][int(State::optim32)] += z.optim_bytes * optim;
  if (c.what_if.onebit_adam)  // fp32 error feedback beside the optimizer states of this rank's shard
    out[int(pl.optim32.tier)][int(State::optim32)] += kOnebitErrorBytes * optim;
  return out;
}

namespace {
// optimizer_chunks without storing them: f(start, params) per chunk.
template <typename F>
void visit_chunks(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, double target, int rank,
                  int stage, F f) {
  const int dp = std::max(1, c.dp);
  const bool owners = pl.fetch == ParamFetch::broadcast && dp > 1 && pl.optim32.partitioned;
  double total = 0, at = 0, start = 0, cur = 0;
  if (owners) visit_units(m, c, stage, [&](OpRole, int, int, double e, bool) { total += e; });
  auto close = [&]() {
    if (cur <= 0) return;
    f(start, cur);
    start += cur;
    cur = 0;
  };
  visit_units(m, c, stage, [&](OpRole, int, int, double whole, bool expert) {
    // the optimizer partition: a 1/dp shard of every unit (1/(dp/ep) of a routed expert's under
    // expert parallelism), or the units this rank owns
    const int ranks = expert ? std::max(1, dp / std::max(1, c.ep)) : dp;
    const double e = owners ? (unit_owner(at, whole, total, dp) == rank ? whole : 0)
                            : whole * (pl.optim32.partitioned ? 1.0 / ranks : 1.0);
    at += whole;
    for (double o = 0; o < e;) {
      const double room = target - cur;
      if (e - o <= room) {
        cur += e - o;
        o = e;
        continue;
      }
      const double cut = std::floor((o + room) / kChunkGranule) * kChunkGranule;
      if (cut > o) {
        cur += cut - o;
        o = cut;
      }
      close();
    }
  });
  close();
}
}  // namespace

std::vector<OptimizerChunk> optimizer_chunks(const ModelSpec& m, const Placement& pl, const TrainingConfig& c,
                                             double target, int rank, int stage) {
  std::vector<OptimizerChunk> out;
  visit_chunks(m, pl, c, target, rank, stage, [&](double start, double params) { out.push_back({start, params}); });
  return out;
}

double optimizer_chunk_bytes_per_param(const Placement& pl, const MemorySizes& z) {
  return (pl.optim32.tier == Tier::nvme ? z.optim_bytes : 0) + (pl.grad16.tier == Tier::nvme ? z.param_bytes : 0) +
         (pl.param16.tier == Tier::nvme ? z.param_bytes : 0);
}

double optimizer_chunk_target(const Placement& pl, const TrainingConfig& c, const HardwareProfile& p, double n,
                              const MemorySizes& z) {
  if (pl.optim32.tier == Tier::gpu) return 0;
  const int wanted = c.optimizer_chunks > 0 ? c.optimizer_chunks : 16;
  if (pl.optim32.tier == Tier::nvme) {
    // Three buffers within the pinned budget, and (unless asked otherwise) at least 16 chunks, so
    // that reading, updating and writing successive chunks overlap and filling and draining the
    // pipeline costs about 2/16 of the phase.
    const double most = std::floor(pinned_per_rank(c, p) / (3 * optimizer_chunk_bytes_per_param(pl, z)));
    return std::max(kChunkGranule, std::min(most, std::ceil(n / wanted)));
  }
  // states in CPU memory need no buffers; chunks let updates start as layers' gradients finish
  if (c.optimizer_overlap == OptimizerOverlap::backward || c.optimizer_chunks > 0)
    return std::max(kChunkGranule, std::ceil(n / wanted));
  return n;
}

namespace {
// The largest of optimizer_chunks and how many there are, remembered per shape: the planner asks
// for the same partition with every micro-batch and checkpoint interval. Beyond a million chunks (a
// tiny pinned budget) `target` each, which the largest is within one granule of.
std::pair<double, double> largest_optimizer_chunk(const ModelSpec& m, const Placement& pl, const TrainingConfig& c,
                                                  double target, double n, int rank, int stage) {
  if (!(target > 0) || !(n > 0)) return {0, 0};
  const double estimate = std::ceil(n / std::min(target, n));
  if (estimate > 1e6) return {std::min(target, n), estimate};
  // the model's kind too: a Llama of the paper's GPT's shape has other units
  using Key = std::tuple<int, long, long, long, int, int, int, int, int, int, double, bool, bool, bool, std::string>;
  const Key key{m.layers, m.hidden, m.vocab, c.seq, c.mp, c.pp, stage, c.tiling_factor, c.dp, rank, target,
                pl.fetch == ParamFetch::broadcast, pl.optim32.partitioned, pl.param16.partitioned,
                m.paper_gpt() ? std::string() : model_yaml(m, "")};
  thread_local std::map<Key, std::pair<double, double>> cache;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  double largest = 0, count = 0;
  visit_chunks(m, pl, c, target, rank, stage, [&](double, double params) {
    largest = std::max(largest, params);
    ++count;
  });
  if (cache.size() > 4096) cache.clear();
  return cache[key] = {largest, count};
}
}  // namespace

namespace {

// What every part of the prediction reads: the shape of one rank's stage and the sizes of what
// comes and goes, derived once.
struct Derived {
  const ModelSpec& m;
  const Placement& pl;
  const TrainingConfig& c;
  const HardwareProfile& p;
  int rank = 0, stage = 0;
  MemorySizes z{};
  int dp = 1, pp = 1, t = 1, ci = 1, mb = 1, ga = 1;
  double mp = 1;
  StageBlocks sb{};
  int nb = 0, segments = 0;
  bool first = true, last = true, broadcast = false;
  double C = 0, whole_ckpt = 0, ckpt = 0;  // Eq. 3 per checkpoint; kept (1/mp when partitioned)
  bool gathered = false, workspace = false, ckpt_gpu = true;
  double awm_block = 0, embed = 0, head = 0, norm = 0;  // 16-bit bytes: embedding, LM head (the embedding when tied), a norm
  int in_flight = 1, other_ckpts = 0;  // micro-steps a 1F1B stage holds checkpoints of; the others'
  Tier pt = Tier::gpu;
  bool resident = false, fetched = false, grad_buffer = false, tied_pending = false;
  bool tied_stages = false;  // the tied embedding's copy on a pipeline's first or last stage
  bool tied_in_forward = false;  // 1F1B runs a forward after the first backward: the sum is alive
  int lookahead = 0;
  std::vector<Group> block_fwd{};  // one block's runs in forward order
  int groups_per_block = 0, keep = 0, keep_segments = 0;
};

Derived derive(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p, int rank,
               const MemorySizes& z, int stage) {
  Derived d{m, pl, c, p, rank, stage, z};
  d.dp = std::max(1, c.dp);
  d.pp = std::max(1, c.pp);
  d.mp = std::max(1, c.mp);
  d.t = std::max(1, c.tiling_factor);
  d.ci = std::max(1, c.ci);
  d.mb = pl.layer_major ? std::max(1, c.micro_batches) : 1;
  d.ga = std::max(1, c.grad_accum);
  // interleaved: a pass runs one chunk of the stage's blocks; the largest stands for them all
  for (const StageBlocks& k : stage_chunks(m.layers, d.pp, c.virtual_stages, stage))
    if (k.last - k.first > d.nb) d.sb = k, d.nb = k.last - k.first;
  d.segments = (d.nb + d.ci - 1) / d.ci;
  d.first = stage == 0;
  d.last = stage == d.pp - 1;
  d.broadcast = pl.fetch == ParamFetch::broadcast && d.dp > 1;
  d.C = double(m.hidden);
  d.whole_ckpt = z.act_bytes * c.bsz * double(c.seq) * d.C;
  // partitioned (DeepSpeed's partition_activations): each tensor-slicing rank keeps 1/mp of it and
  // all-gathers it whole for its segment's recompute
  d.gathered = pl.act_ckpt.partitioned && d.mp > 1;
  d.ckpt = d.gathered ? d.whole_ckpt / d.mp : d.whole_ckpt;
  d.workspace = z.workspace_bytes >= 0;
  d.awm_block = d.workspace ? 0 : awm_bytes(m, c.bsz, c.seq, 1, c.what_if.attention_density) / d.mp;
  d.embed = z.param_bytes * mp_param_elems(OpRole::embed, false, embed_param_elems(m, c.seq), 0, c);
  d.head = m.tied_embeddings ? d.embed : z.param_bytes * mp_param_elems(OpRole::lm_head, false, head_param_elems(m), 0, c);
  d.norm = z.param_bytes * norm_param_elems(m);
  d.ckpt_gpu = pl.act_ckpt.tier == Tier::gpu;
  d.in_flight = d.pp > 1 ? pipeline_in_flight(d.pp, c.virtual_stages, d.ga, stage) : 1;
  d.other_ckpts = (d.in_flight - 1) * d.segments * d.mb;
  d.pt = pl.param16.tier;
  d.resident = d.pt == Tier::gpu && !pl.param16.partitioned;
  d.fetched = !d.resident && (d.pt != Tier::gpu || (d.dp > 1 && (pl.param16.partitioned || d.broadcast)));
  // The GPU buffer of a group is made by its CPU->GPU copy, `depth - 1` groups ahead, or (shard on
  // the GPU) by its all-gather, `depth - 2` ahead.
  d.lookahead = d.pt != Tier::gpu ? std::max(c.prefetch_depth - 1, 0) : std::max(c.prefetch_depth - 2, 0);
  d.grad_buffer = pl.grad16.tier != Tier::gpu || (pl.grad16.partitioned && d.dp > 1);
  // the tied embedding's gradient collects over backward; under pipeline stages, on the first and
  // the last stage, over every micro-step (it leaves once the stage's backward is done)
  d.tied_stages = d.grad_buffer && m.tied_embeddings && d.pp > 1 && (d.first || d.last);
  d.tied_pending = d.grad_buffer && m.tied_embeddings && ((d.first && d.last) || d.tied_stages);
  if (d.tied_stages) {  // a forward after the first backward of the chunk with the tied copy
    const int tied_chunk = d.first ? 0 : std::max(1, c.virtual_stages) - 1;
    bool backward_seen = false;
    for (const PipelinePass& x : pipeline_order(d.pp, c.virtual_stages, d.ga, stage)) {
      if (!x.forward && x.chunk == tied_chunk) backward_seen = true;
      if (x.forward && backward_seen) d.tied_in_forward = true;
    }
  }
  d.groups_per_block = 0;
  for (const BlockParamOp& op : block_param_ops(m)) {
    const double bytes = z.param_bytes * mp_param_elems(op.role, op.linear, op.elems, op.bias * op.copies, c);
    const int per = op.linear ? d.t : 1;
    const double each = bytes / (per * op.copies);  // an expert's units one by one
    const int copies = local_copies(m, c, op), routed = op.copies > 1 && c.ep > 1 ? m.moe.experts / c.ep : 0;
    if (routed > 0) {  // this rank's routed experts, then the shared ones
      Group g{each, to_string(op.role), 0, per * routed};
      g.expert = true;
      d.block_fwd.push_back(g);
    }
    if (copies - routed > 0) d.block_fwd.push_back({each, to_string(op.role), 0, per * (copies - routed)});
    d.groups_per_block += per * copies;
  }
  // Identical blocks repeat: beyond `keep` blocks from either end of a run of them, more only add
  // moments with fewer checkpoints (or the same) and the same windows, so they are left out
  // (windows still see `keep` blocks of groups ahead, more than the lookahead).
  d.keep = d.lookahead / d.groups_per_block + 2;
  d.keep_segments = d.lookahead / (2 * std::min(d.ci, d.nb) * d.groups_per_block) + 1;
  if (d.mb > 1) {  // l2l's loops: windows span whole loops, every block is seen
    d.keep = d.nb;
    d.keep_segments = d.segments;
  }
  return d;
}

// The fullest GPU moment: what is alive while one group's compute runs.
struct Moment {
  double total = -1, window = 0, grad = 0, tied = 0, act = 0;
  int ckpts = 0, groups = 0, at = 0;  // at: which group of the run
  Group g;
  const char* phase = "";
};

void add_block(const Derived& d, std::vector<Group>& list, int b, bool reverse, bool backward, int ckpts, double act,
               bool eval, int whole = 0) {
  const size_t at = list.size();
  for (const Group& g0 : d.block_fwd) {
    Group g = g0;
    g.block = b;
    g.backward = backward;
    g.ckpts = ckpts;
    g.whole = whole;
    g.act = act;
    g.evaluate = eval;
    list.push_back(g);
  }
  if (reverse) std::reverse(list.begin() + long(at), list.end());
}

// Forward: embedding, blocks (a checkpoint as each segment starts, one block's AWM), LN and head.
// Numbers the groups from `from` on as l2l loop `id`.
void loop_of(std::vector<Group>& list, size_t from, int id) {
  for (size_t i = from; i < list.size(); ++i) list[i].loop = id;
}

void forward_list(const Derived& d, std::vector<Group>& list) {
  int loops = 0;
  if (d.first) list.push_back({d.embed, "embed", -1, 1, false, false, false, 0, 0, true});
  loop_of(list, 0, loops++);
  for (int rb = 0; rb < d.nb; ++rb) {
    if (rb >= d.keep && rb < d.nb - d.keep) continue;  // identical middle blocks: fewer checkpoints
    const int ckpts = d.ckpt_gpu ? (rb / d.ci + 1) * d.mb : 0;
    const size_t at = list.size();
    // one micro-batch in the block at a time (l2l), so one block's AWM
    add_block(d, list, d.sb.first + rb, false, false, ckpts, d.awm_block, true);
    loop_of(list, at, loops++);
  }
  if (d.last) {
    const int ckpts = d.ckpt_gpu ? d.segments * d.mb : 0;
    const size_t at = list.size();
    list.push_back({d.norm, "ln_f", -1, 1, false, false, false, ckpts, 0, true});
    list.push_back({d.head, "lm_head", -1, 1, false, true, false, ckpts, 0, true});
    loop_of(list, at, loops++);
  }
}

// Backward: head and LN, then each segment's recompute and backward (its checkpoint loaded, its
// blocks' AWM), then the embedding; the middle of a long run of identical segments left out.
void backward_list(const Derived& d, std::vector<Group>& list) {
  int loops = 0;
  if (d.last) {
    const int ckpts = d.ckpt_gpu ? d.segments * d.mb : 0;
    list.push_back({d.head, "lm_head", -1, 1, true, true, false, ckpts, 0, true});
    list.push_back({d.norm, "ln_f", -1, 1, true, false, false, ckpts, 0, true});
  }
  loop_of(list, 0, loops++);
  auto add_blocks = [&](int b0, int b1, bool reverse, bool backward, int ckpts, double act, bool eval, int whole) {
    for (int i = 0; i < b1 - b0; ++i) {
      if (i >= d.keep && i < b1 - b0 - d.keep) continue;
      add_block(d, list, reverse ? b1 - 1 - i : b0 + i, reverse, backward, ckpts, act, eval, whole);
    }
  };
  for (int sg = d.segments - 1; sg >= 0; --sg) {
    // segments below the top ones repeat the same groups with fewer checkpoints
    if (sg < d.segments - 2 - d.keep_segments && sg > d.keep_segments) continue;
    const bool eval = sg >= d.segments - 2 || sg <= d.keep_segments;
    const int b0 = d.sb.first + sg * d.ci, b1 = std::min(d.sb.last, b0 + d.ci);
    const int ckpts = d.ckpt_gpu ? (sg + 1) * d.mb : d.mb;  // offloaded: this segment's, loaded back
    const double act = d.awm_block * (b1 - b0);  // one micro-batch's recompute and backward at a time
    const int whole = d.gathered ? d.mb : 0;
    const size_t at = list.size();
    add_blocks(b0, b1, false, false, ckpts, act, eval, whole);
    add_blocks(b0, b1, true, true, ckpts, act, eval, whole);
    loop_of(list, at, loops++);
  }
  const size_t at = list.size();
  if (d.first) list.push_back({d.embed, "embed", -1, 1, true, false, true, 0, 0, true});
  loop_of(list, at, loops++);
}

// The fullest moment of one compute list: the fetched window of the L + 1 groups from each group
// on, the running group's gradient, the tied embedding's pending one, checkpoints and AWM.
// `pending`: the tied embedding's sum is alive from the list's start; `fewer`: checkpoints of the
// other micro-steps in flight fewer than d.other_ckpts.
void evaluate_pass(const Derived& d, const std::vector<Group>& list, const char* phase, Moment& best, bool pending,
                   int fewer) {
  auto window_from = [&](size_t r, int j, int& groups, int left) {
    double sum = 0;
    groups = 0;
    for (; r < list.size() && left > 0; ++r, j = 0) {
      const int take = std::min(left, list[r].count - j);
      sum += take * list[r].bytes;
      groups += take;
      left -= take;
    }
    return d.fetched ? sum : 0;
  };
  // l2l (micro-batches > 1): a loop's groups stay from its first micro-batch to its last, so from
  // the second micro-batch on the whole loop is fetched, and its prefetch reaches past its end;
  // its gradients collect over the micro-batches, all at once
  std::vector<size_t> loop_start(list.size(), 0);
  int loops = 0;  // by loop number + 1 (loop_of; -1 outside any)
  for (const Group& g : list) loops = std::max(loops, g.loop + 2);
  std::vector<double> loop_grads(size_t(loops), 0.0);
  std::vector<int> loop_groups(size_t(loops), 0);
  for (size_t r = 0; r < list.size(); ++r) {
    loop_start[r] = r > 0 && list[r - 1].loop == list[r].loop ? loop_start[r - 1] : r;
    loop_groups[size_t(list[r].loop + 1)] += list[r].count;
    const bool collects = d.tied_pending && (list[r].lm_head || list[r].embed_backward);
    if (list[r].backward && d.grad_buffer && !collects) loop_grads[size_t(list[r].loop + 1)] += list[r].count * list[r].bytes;
  }
  for (size_t r = 0; r < list.size(); ++r) {
    const Group& g = list[r];
    if (g.backward && (g.lm_head || (g.embed_backward && d.tied_stages)) && d.tied_pending) pending = true;
    if (!g.evaluate) continue;
    // the LM head's and the embedding's backward add to the tied embedding's pending buffer
    const bool collects = d.tied_pending && (g.lm_head || g.embed_backward);
    const double grad = d.mb > 1 ? loop_grads[size_t(g.loop + 1)] : g.backward && d.grad_buffer && !collects ? g.bytes : 0;
    const double tied = pending ? d.embed : 0;
    const int ckpts = g.ckpts + (d.ckpt_gpu ? std::max(0, d.other_ckpts - fewer) : 0);
    // inside a run the window changes only where it reaches past the run's end
    for (int j = 0; j < g.count; j = std::max(j + 1, g.count - d.lookahead - 1)) {
      int groups = 0;
      double window = 0;
      if (d.mb > 1) {
        window = window_from(loop_start[r], 0, groups, loop_groups[size_t(g.loop + 1)] + d.lookahead);
      } else {
        window = window_from(r, j, groups, d.lookahead + 1);
      }
      const double total = window + grad + tied + ckpts * d.ckpt + g.whole * d.whole_ckpt + g.act;
      if (total > best.total) best = {total, window, grad, tied, g.act, ckpts, groups, j, g, phase};
    }
  }
}

void evaluate(const Derived& d, const std::vector<Group>& list, const char* phase, Moment& best) {
  // Under stages the tied embedding's sum is alive from the first micro-step's backward on, and in
  // the forwards 1F1B runs after it. The first micro-step's backward runs without it; on the first
  // stage, when no forward follows that backward, the later ones hold one micro-step's
  // checkpoints fewer than it.
  if (std::string(phase) == "forward") return evaluate_pass(d, list, phase, best, d.tied_in_forward, 0);
  evaluate_pass(d, list, phase, best, false, 0);
  if (d.tied_stages && d.ga > 1)
    evaluate_pass(d, list, phase, best, true, d.tied_in_forward || d.last ? 0 : d.segments * d.mb);
}

// The GPU tier: persistent states, then the buffers of the fullest moment.
void fill_gpu(const Derived& d, const Moment& best, TierMemory& gpu) {
  std::vector<MemoryPart> parts;
  if (best.window > 0)
    parts.push_back({"fetched parameters (" + std::to_string(best.groups) + " groups: prefetch depth " +
                         std::to_string(d.c.prefetch_depth) + ")",
                     best.window});
  if (best.grad > 0) parts.push_back({"gradient of the running group, before its reduce or offload", best.grad});
  if (best.tied > 0)
    parts.push_back({d.tied_stages ? "tied embedding gradient (summed over the micro-steps, then with the other stage's)"
                                   : "tied embedding gradient (LM head to embedding backward)",
                     best.tied});
  if (best.ckpts > 0)
    parts.push_back({"activation checkpoints on the GPU (" + std::to_string(best.ckpts) + " of Eq. 3's " +
                         std::to_string(d.segments * d.mb * d.in_flight) + (d.gathered ? ", 1/mp of each" : "") + ")",
                     best.ckpts * d.ckpt});
  if (best.g.whole > 0)
    parts.push_back({"checkpoints all-gathered whole for the segment's recompute", best.g.whole * d.whole_ckpt});
  if (best.act > 0)
    parts.push_back({best.phase == std::string("forward") ? "AWM (Eq. 5) of one block" : "AWM (Eq. 5) of a segment's blocks",
                     best.act});
  if (d.workspace) parts.push_back({"activation workspace (preallocated)", d.z.workspace_bytes});
  if (best.total >= 0) {
    const Group& g = best.g;
    std::string what = g.block >= 0 ? "block" + std::to_string(g.block) + "." + g.op : std::string(g.op);
    if (g.count > 1) {
      const int copies = g.count / std::max(1, d.t);  // experts of a mixture of experts' layer
      what += tile_suffix(g.backward ? g.count - 1 - best.at : best.at, copies, d.t);
    }
    gpu.moment = std::string(g.backward ? "backward" : best.phase) + " of " + what;
  }
  double persistent = 0;
  for (double b : gpu.persistent) persistent += b;
  gpu.parts.insert(gpu.parts.end(), parts.begin(), parts.end());
  gpu.buffer_parts = parts.size();
  gpu.peak_bytes = persistent + std::max(0.0, best.total) + (d.workspace ? d.z.workspace_bytes : 0);
}

// Parameters read from NVMe wait in CPU memory from their read (`depth` groups ahead) to their copy
// to the GPU (`depth - 1` ahead): the first depth + 1 groups' at the start of a compute list, later
// the group read `depth` ahead beside the one before it (its copy is issued just after).
struct NcStaging {
  double start = 0, one = 0, pair = 0;
};
NcStaging nc_staging(const Derived& d, const std::vector<Group>& fwd, const std::vector<Group>& bwd, double pshare) {
  NcStaging n;
  const int depth = std::max(d.c.prefetch_depth, 0);
  for (const std::vector<Group>* list : {&fwd, &bwd}) {
    double head = 0, prev = 0;
    int left = depth + 1;  // the first depth + 1 groups
    for (const Group& g : *list) {
      const double slice = g.bytes * std::min(1.0, pshare * (g.expert ? d.c.ep : 1));
      head += std::min(left, g.count) * slice;
      left -= std::min(left, g.count);
      n.one = std::max(n.one, slice);
      n.pair = std::max(n.pair, (g.count > 1 ? slice : prev) + slice);
      prev = slice;
    }
    n.start = std::max(n.start, head);
  }
  if (depth == 0) n.pair = n.one;
  return n;
}

// A gradient staged for NVMe beside the read of the group `depth` ahead of it (with depth 0 a
// group's copy to the GPU follows its read at once: no read waits): (both, the gradient alone).
// `accumulates`: a later micro-step's gradient is staged beside the earlier ones' sum read back
// (not the tied embedding's under stages: it leaves once, summed on the GPU).
std::pair<double, double> gc_staging(const Derived& d, const std::vector<Group>& bwd, double pshare, double gshare,
                                     bool accumulates) {
  double pair = 0, alone = 0;
  const int depth = std::max(d.c.prefetch_depth, 0);
  const bool nc_staged = d.pt == Tier::nvme;
  for (size_t r = 0; r < bwd.size(); ++r) {
    if (!bwd[r].backward) continue;
    const bool tied = d.tied_stages && (bwd[r].lm_head || bwd[r].embed_backward);
    const double gc = bwd[r].bytes * std::min(1.0, gshare * (bwd[r].expert ? d.c.ep : 1)) * (accumulates && !tied ? 2 : 1);
    for (int j = 0; j < bwd[r].count; j = std::max(j + 1, bwd[r].count - depth - 1)) {
      double ahead = 0;  // the slice of the group `depth` after group j of run r
      if (nc_staged && depth >= 1) {
        int k = j + depth;
        for (size_t q = r; q < bwd.size(); k -= bwd[q].count, ++q)
          if (k < bwd[q].count) {
            ahead = bwd[q].bytes * std::min(1.0, pshare * (bwd[q].expert ? d.c.ep : 1));
            break;
          }
      }
      if (gc + ahead > pair) {
        pair = gc + ahead;
        alone = gc;
      }
    }
  }
  return {pair, alone};
}

double sum_parts(const std::vector<MemoryPart>& v) {
  double s = 0;
  for (const MemoryPart& part : v) s += part.bytes;
  return s;
}

// The optimizer's CPU buffers (chunks in flight, staged gradients and parameters); with the
// backward overlap one chunk's at a time, which move to `chunk_parts` (they sit beside a pass).
void optimizer_parts(const Derived& d, std::vector<MemoryPart>& optim, std::vector<MemoryPart>& passes,
                     std::vector<MemoryPart>& chunk_parts) {
  if (d.pl.optim32.tier == Tier::gpu) return;
  const double n = kept_state_elems(d.m, d.c, d.stage, d.pl, d.pl.optim32, d.rank);
  const double target = optimizer_chunk_target(d.pl, d.c, d.p, n, d.z);
  const auto [chunk, chunks] = largest_optimizer_chunk(d.m, d.pl, d.c, target, n, d.rank, d.stage);
  const double per_param = optimizer_chunk_bytes_per_param(d.pl, d.z);
  // three chunks in flight (read, update, write), or one at a time as backward finishes them
  const bool one_at_a_time = d.c.optimizer_overlap == OptimizerOverlap::backward;
  const int slots = one_at_a_time ? 1 : int(std::min(3.0, chunks));
  if (per_param > 0)
    optim.push_back({"optimizer chunk buffers (" + std::to_string(slots) + " in flight)", slots * per_param * chunk});
  if (d.pl.grad16.tier == Tier::gpu && d.c.optimizer_overlap == OptimizerOverlap::none)
    optim.push_back({"gradients staged for the CPU optimizer", d.z.param_bytes * n});
  if (d.pt == Tier::gpu) {
    if (d.c.optimizer_overlap == OptimizerOverlap::dpu)  // every chunk's parameters wait for the last compute
      passes.push_back({"updated parameters waiting for the GPU (delayed update)", d.z.param_bytes * n});
    else optim.push_back({"updated parameters on their way to the GPU (one chunk)", d.z.param_bytes * chunk});
  }
  if (one_at_a_time) {
    chunk_parts = optim;
    optim.clear();
  }
}

// The CPU tier: persistent states, then the fullest of the passes' buffers (checkpoints, staged
// NVMe reads and writes, a backward-overlapped chunk) and the optimizer's after backward.
void fill_cpu(const Derived& d, const std::vector<Group>& fwd, const std::vector<Group>& bwd, MemoryModel& out) {
  TierMemory& cpu = out.tiers[size_t(Tier::cpu)];
  std::vector<MemoryPart> passes, optim, chunk_parts;
  if (!d.ckpt_gpu)
    passes.push_back({"offloaded activation checkpoints (Eq. 3)", double(d.segments * d.mb * d.in_flight) * d.ckpt});
  const double pshare = d.pl.param16.partitioned && !d.broadcast ? 1.0 / d.dp : 1.0;
  const double gshare = d.pl.grad16.partitioned && !d.broadcast ? 1.0 / d.dp : 1.0;
  const bool nc_staged = d.pt == Tier::nvme;
  const NcStaging nc = nc_staging(d, fwd, bwd, pshare);
  // gradient accumulation: a later micro-step's gradient waits in CPU memory to be added to the
  // earlier ones' sum, which on NVMe is read back beside it (one group at a time)
  const bool accumulates = d.ga > 1 && d.pl.grad16.tier != Tier::gpu;
  auto [gc_pair, gc_alone] = d.pl.grad16.tier == Tier::nvme ? gc_staging(d, bwd, pshare, gshare, accumulates)
                                                            : std::pair<double, double>{0, 0};
  optimizer_parts(d, optim, passes, chunk_parts);
  const double overlapped_chunk = sum_parts(chunk_parts);  // backward overlap: one chunk's buffers beside a steady moment
  // the fullest of: the start of a pass (depth + 1 reads), a gradient's write beside a read, and
  // (backward overlap) a chunk's update beside a read, which bounds it from above
  const double start = nc_staged ? std::max(nc.start, nc.pair) : 0;
  const double one = nc_staged && d.c.prefetch_depth >= 1 ? nc.one : 0;
  const double chunk_moment = overlapped_chunk > 0 ? overlapped_chunk + one : 0;
  if (start > 0 && start >= gc_pair && start >= chunk_moment) {
    passes.push_back({nc.start >= nc.pair ? "parameters staged from NVMe (the first depth + 1 groups of a pass)"
                                          : "parameters staged from NVMe (two groups read ahead)",
                      start});
  } else if (gc_pair > 0 && gc_pair >= chunk_moment) {
    passes.push_back({"gradient staged for NVMe (one group)", gc_alone});
    if (gc_pair > gc_alone) passes.push_back({"parameters staged from NVMe (the group depth ahead)", gc_pair - gc_alone});
  } else if (chunk_moment > 0) {
    if (one > 0) passes.push_back({"parameters staged from NVMe (one group, at most)", one});
    passes.insert(passes.end(), chunk_parts.begin(), chunk_parts.end());
  }
  if (accumulates && d.pl.grad16.tier == Tier::cpu) {  // the largest unit's part this rank keeps
    double total = 0, at = 0, largest = 0;
    visit_units(d.m, d.c, d.stage, [&](OpRole, int, int, double e, bool) { total += e; });
    visit_units(d.m, d.c, d.stage, [&](OpRole role, int, int, double whole, bool expert) {
      const double kept = d.broadcast ? (unit_owner(at, whole, total, d.dp) == d.rank ? whole : 0)
                                      : whole * std::min(1.0, gshare * (expert ? d.c.ep : 1));
      const bool tied = d.tied_stages && role == OpRole::embed;  // summed on the GPU, staged once
      if (!tied) largest = std::max(largest, kept * d.z.param_bytes);
      at += whole;
    });
    passes.push_back({"a later micro-step's gradient staged for its sum (one unit)", largest});
  }
  const bool optim_binds = d.c.optimizer_overlap == OptimizerOverlap::none && sum_parts(optim) > sum_parts(passes);
  const std::vector<MemoryPart>& chosen = optim_binds ? optim : passes;
  double persistent = 0;
  for (double b : cpu.persistent) persistent += b;
  cpu.parts.insert(cpu.parts.end(), chosen.begin(), chosen.end());
  cpu.buffer_parts = chosen.size();
  out.cpu_buffer_bytes = sum_parts(chosen);
  cpu.peak_bytes = persistent + out.cpu_buffer_bytes;
  cpu.moment = chosen.empty() ? "" : optim_binds ? "optimizer" : "forward and backward";
}

}  // namespace

MemoryModel memory_model(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p,
                         int rank, const MemorySizes& z, int stage) {
  MemoryModel out;
  const Derived d = derive(m, pl, c, p, rank, z, stage);
  const std::array<double, kTiers> cap = capacity_per_rank(c, p);
  const auto persistent = persistent_state_bytes(m, pl, c, rank, z, stage);
  for (int ti = 0; ti < kTiers; ++ti) {
    TierMemory& tm = out.tiers[size_t(ti)];
    tm.capacity_bytes = cap[size_t(ti)];
    tm.persistent = persistent[size_t(ti)];
    for (State s : {State::param16, State::grad16, State::optim32}) {
      if (int(pl.of(s).tier) != ti || tm.persistent[size_t(s)] <= 0) continue;
      std::string words = part_words(s, pl.of(s), d.broadcast);
      if (s == State::optim32 && c.what_if.onebit_adam) words += " with 1-bit Adam's error feedback";
      tm.parts.push_back({words, tm.persistent[size_t(s)]});
    }
  }
  thread_local std::vector<Group> fwd, bwd;  // scratch reused across calls (the planner makes many)
  fwd.clear();
  bwd.clear();
  forward_list(d, fwd);
  backward_list(d, bwd);
  Moment best;
  evaluate(d, fwd, "forward", best);
  evaluate(d, bwd, "recompute", best);
  fill_gpu(d, best, out.tiers[size_t(Tier::gpu)]);
  fill_cpu(d, fwd, bwd, out);
  TierMemory& nvme = out.tiers[size_t(Tier::nvme)];
  for (double b : nvme.persistent) nvme.peak_bytes += b;
  return out;
}

FullestStages fullest_stages(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p,
                             int rank, const MemorySizes& z) {
  const int pp = std::max(1, c.pp);
  FullestStages out;
  std::set<std::vector<int>> layouts;
  for (int s = 0; s < pp; ++s) {
    std::vector<int> sizes;
    for (const StageBlocks& b : stage_chunks(m.layers, pp, c.virtual_stages, s)) sizes.push_back(b.last - b.first);
    const bool fresh = layouts.insert(std::move(sizes)).second;
    if (!fresh && s != pp - 1) continue;
    MemoryModel mm = memory_model(m, pl, c, p, rank, z, s);
    bool fullest = false;
    for (int t = 0; t < kTiers; ++t)
      if (s == 0 || mm.tiers[size_t(t)].peak_bytes > out.of(Tier(t)).tiers[size_t(t)].peak_bytes) {
        out.stage[size_t(t)] = s;
        out.which[size_t(t)] = out.models.size();
        fullest = true;
      }
    if (fullest) out.models.push_back(std::move(mm));
  }
  return out;
}

}  // namespace memwall
