#include "planner/fit.hpp"

#include <algorithm>
#include <cmath>

#include "model/units.hpp"

namespace memwall::planner {
namespace {

// Sec. 3: mixed-precision Adam keeps 20 bytes per parameter: fp16 parameter (2), fp16 gradient
// (2), fp32 parameter, momentum, variance and gradient (16). Eq. 2 is the total.
double state_fraction(State s) {
  switch (s) {
    case State::param16: return 2.0 / 20.0;
    case State::grad16: return 2.0 / 20.0;
    case State::optim32: return 16.0 / 20.0;
    case State::act_ckpt: return 0;
  }
  return 0;
}

// Bytes of one model state for the whole model: Eq. 2's share plus the embeddings' 20 B/param.
double state_total_bytes(const ModelSpec& m, State s) {
  return state_fraction(s) * (model_state_bytes_eq2(m.layers, m.hidden) + 20.0 * embedding_params(m));
}

// 1-bit Adam's fp32 error feedback for the whole model, in optim32's shares (seed 004).
double onebit_error_total_bytes(const ModelSpec& m) {
  return state_total_bytes(m, State::optim32) * kOnebitErrorBytes / 16.0;
}
constexpr const char* kOnebitErrorWords = "1-bit Adam error feedback, fp32 (beside optim32)";

const char* state_words(State s, bool partitioned) {
  switch (s) {
    case State::param16: return partitioned ? "param16 (1/dp share)" : "param16 (whole copy)";
    case State::grad16: return partitioned ? "grad16 (1/dp share)" : "grad16 (whole copy)";
    case State::optim32: return partitioned ? "optim32 (1/dp share)" : "optim32 (whole copy)";
    case State::act_ckpt: return "act_ckpt";
  }
  return "?";
}

int ranks_per_node(const Candidate& c, const HardwareProfile& p) {
  return p.ranks_per_node(long(c.config.dp) * c.config.mp * std::max(1, c.config.pp));
}

// Pipeline stages (config.pp): the share of the transformer blocks' states one stage holds, and
// the embedding beside them on the first and the last stage (the last keeps a copy for the tied
// LM head), so the first or the last stage binds.
double stage_state_bytes(const ModelSpec& m, State s, int pp) {
  if (pp <= 1) return state_total_bytes(m, s);
  return state_fraction(s) * (model_state_bytes_eq2(m.layers, m.hidden) / pp + 20.0 * embedding_params(m));
}
// Checkpoints a stage keeps: its blocks' (Eq. 3) for each micro-batch in flight, min(pp, m) on the
// first stage under 1F1B.
double stage_ckpt_bytes(const ModelSpec& m, const TrainingConfig& k) {
  const int pp = std::max(1, k.pp);
  const int layers = (m.layers + pp - 1) / pp;
  const int in_flight = pp > 1 ? std::min(pp, std::max(1, k.grad_accum)) : 1;
  return act_ckpt_bytes_eq3(k.bsz, k.seq, m.hidden, layers, std::min(k.ci, layers)) * in_flight;
}

double bw_of(const std::vector<StateTierEfficiency>& eff, AitState s, const char* tier) {
  for (const auto& e : eff)
    if (e.state == s && e.tier == tier) return e.bw_Bps;
  return 0;
}

// Time to move `bytes` at `bw`; a missing bandwidth (0) means the path does not exist here.
double transfer_s(double bytes, double bw) {
  if (bytes <= 0) return 0;
  return bw > 0 ? bytes / bw : INFINITY;
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

double embedding_params(const ModelSpec& m) { return double(m.vocab + m.seq) * double(m.hidden); }

double largest_partition_elems(const ModelSpec& m, const Candidate& c, State s) {
  const TrainingConfig& k = c.config;
  const double fc1 = mswm_bytes_eq4(m.hidden) / 4.0 / k.mp / k.tiling_factor;  // Eq. 4 is 4 B x (hd x 4hd)
  const double embed = double(m.vocab) * double(m.hidden) / k.mp;
  const double whole = std::max(fc1, embed);
  return std::ceil(c.placement.of(s).partitioned ? whole / k.dp : whole);
}

int nodes_used(const Candidate& c, const HardwareProfile& p) {
  const long gpus = long(c.config.dp) * c.config.mp * std::max(1, c.config.pp);
  return std::max(1, int((gpus + p.gpus_per_node - 1) / p.gpus_per_node));
}

FitReport check_fit(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const FitOptions& o) {
  const TrainingConfig& k = c.config;
  const Placement& pl = c.placement;
  const double dp = k.dp, mp = k.mp, t = k.tiling_factor;
  const int nodes = nodes_used(c, p);
  const int ranks = ranks_per_node(c, p);
  FitReport r;

  // ---- one GPU ----
  LimitCheck gpu{Resource::gpu_memory, "per GPU", 0, p.gpu_memory_bytes, {}};
  const int pp = std::max(1, k.pp);
  for (State s : {State::param16, State::grad16, State::optim32}) {
    const StatePlacement& sp = pl.of(s);
    if (sp.tier == Tier::gpu)
      gpu.parts.push_back({state_words(s, sp.partitioned), stage_state_bytes(m, s, pp) / mp / (sp.partitioned ? dp : 1)});
  }
  if (k.what_if.onebit_adam && pl.optim32.tier == Tier::gpu)
    gpu.parts.push_back({kOnebitErrorWords, onebit_error_total_bytes(m) / mp / (pl.optim32.partitioned ? dp : 1)});
  const bool params_whole = pl.param16.tier == Tier::gpu && !pl.param16.partitioned;
  const bool grads_whole = pl.grad16.tier == Tier::gpu && !pl.grad16.partitioned;
  const double mswm = mswm_bytes_eq4(m.hidden) / mp / t;
  // The tied embedding / LM head (vocab x hd, untiled) is the largest operator of models with a
  // small hidden size; Eq. 4 counts only the transformer block's fc1.
  const double embed_pg = 4.0 * double(m.vocab) * double(m.hidden) / mp;
  if (!params_whole) {
    if (embed_pg > mswm) gpu.parts.push_back({"tied embedding parameters + gradients (largest operator)", embed_pg});
    else gpu.parts.push_back({"MSWM (Eq. 4) / tiling", mswm});
    gpu.parts.push_back({"prefetched parameters (depth - 1 operators)", std::max(0, k.prefetch_depth - 1) * mswm / 2});
  } else if (!grads_whole) {
    gpu.parts.push_back({"gradient of the largest operator before reduce-scatter", std::max(mswm, embed_pg) / 2});
  }
  gpu.parts.push_back({"AWM (Eq. 5)",
                       awm_bytes_eq5(k.bsz, k.seq, k.ci, m.hidden, m.heads, k.what_if.attention_density) / mp});
  if (pl.act_ckpt.tier == Tier::gpu)
    gpu.parts.push_back({pp > 1 ? "activation checkpoints (Eq. 3) of the stage's micro-batches in flight"
                                : "activation checkpoints (Eq. 3)",
                         stage_ckpt_bytes(m, k)});
  else
    gpu.parts.push_back({"checkpoint being loaded", act_ckpt_bytes_eq3(k.bsz, k.seq, m.hidden, 1, 1)});
  for (const Part& part : gpu.parts) gpu.needed_bytes += part.bytes;
  r.checks.push_back(std::move(gpu));

  if (o.max_alloc_bytes > 0) {
    // Only the transformer blocks' tensors: memory-centric tiling splits their linear weights
    // (Sec. 5.1.3); the embedding is outside the paper's one-layer experiment (Table 5 counts
    // 12 hd^2 parameters only).
    LimitCheck big{Resource::gpu_largest_alloc, "per GPU", 0, o.max_alloc_bytes, {}};
    big.parts.push_back({"fc1 weight tile, fp16 (Eq. 4 / 2 / tiling)", mswm / 2});
    big.parts.push_back({"fc1 output activation, fp16", 2.0 * k.bsz * double(k.seq) * 4.0 * double(m.hidden) / mp});
    big.parts.push_back({"attention scores, fp16",
                         2.0 * k.bsz * (m.heads / mp) * double(k.seq) * double(k.seq) * k.what_if.attention_density});
    for (const Part& part : big.parts) big.needed_bytes = std::max(big.needed_bytes, part.bytes);
    r.checks.push_back(std::move(big));
  }

  // ---- pinned staging buffers of one node (Sec. 6.3) ----
  LimitCheck pinned{Resource::pinned, "per node", 0, p.pinned_budget_bytes, {}};
  if (pl.param16.tier == Tier::nvme)
    pinned.parts.push_back({"parameter swap buffers",
                            double(o.param_buffer_count) * largest_partition_elems(m, c, State::param16) * 2.0 * ranks});
  if (pl.optim32.tier == Tier::nvme)
    pinned.parts.push_back({"optimizer swap buffers", double(o.optim_buffer_count) *
                                                          largest_partition_elems(m, c, State::optim32) *
                                                          (pl.grad16.tier == Tier::nvme ? 18.0 : 16.0) * ranks});
  for (const Part& part : pinned.parts) pinned.needed_bytes += part.bytes;

  // ---- CPU memory of one node ----
  // A whole copy per node, or with pipeline stages the copies of the stages on the node.
  const double stages_on_node = std::max(1.0, std::min(double(pp), double(p.gpus_per_node) / (dp * mp)));
  auto per_node = [&](State s, bool partitioned) {
    return partitioned ? state_total_bytes(m, s) / nodes : stage_state_bytes(m, s, pp) * (pp > 1 ? stages_on_node : 1);
  };
  LimitCheck cpu{Resource::cpu_memory, "per node", 0, p.cpu_memory_bytes, {}};
  for (State s : {State::param16, State::grad16, State::optim32}) {
    const StatePlacement& sp = pl.of(s);
    if (sp.tier == Tier::cpu) cpu.parts.push_back({state_words(s, sp.partitioned), per_node(s, sp.partitioned)});
  }
  if (k.what_if.onebit_adam && pl.optim32.tier == Tier::cpu)
    cpu.parts.push_back({kOnebitErrorWords, onebit_error_total_bytes(m) / (pl.optim32.partitioned ? nodes : 1)});
  if (pl.act_ckpt.tier == Tier::cpu)
    cpu.parts.push_back({"activation checkpoints (Eq. 3) of the node's GPUs", stage_ckpt_bytes(m, k) * ranks});
  if (pinned.needed_bytes > 0) cpu.parts.push_back({"pinned staging buffers", pinned.needed_bytes});
  for (const Part& part : cpu.parts) cpu.needed_bytes += part.bytes;
  r.checks.push_back(std::move(cpu));
  r.checks.push_back(std::move(pinned));

  // ---- NVMe of one node ----
  LimitCheck nvme{Resource::nvme, "per node", 0, p.nvme_capacity_bytes, {}};
  for (State s : {State::param16, State::grad16, State::optim32}) {
    const StatePlacement& sp = pl.of(s);
    if (sp.tier == Tier::nvme) nvme.parts.push_back({state_words(s, sp.partitioned), per_node(s, sp.partitioned)});
  }
  if (k.what_if.onebit_adam && pl.optim32.tier == Tier::nvme)
    nvme.parts.push_back({kOnebitErrorWords, onebit_error_total_bytes(m) / (pl.optim32.partitioned ? nodes : 1)});
  for (const Part& part : nvme.parts) nvme.needed_bytes += part.bytes;
  r.checks.push_back(std::move(nvme));
  return r;
}

TimeBreakdown estimate_time(const ModelSpec& m, const Candidate& c, const HardwareProfile& p,
                            const std::vector<StateTierEfficiency>& eff_in) {
  const TrainingConfig& k = c.config;
  const Placement& pl = c.placement;
  std::vector<StateTierEfficiency> own;
  const std::vector<StateTierEfficiency>& eff = eff_in.empty() ? (own = tier_efficiencies(p, m, k, k.dp)) : eff_in;
  const double dp = k.dp, mp = k.mp, ga = std::max(1, k.grad_accum), pp = std::max(1, k.pp);
  const double peak = p.peak_flops_per_s(m.hidden);
  // one micro-step of one GPU without slicing, then of one tensor slice of one pipeline stage
  const double flops_model = computation_flops_eq7(k.bsz, k.seq, params_eq1(m.layers, m.hidden)) / pp;
  const double flops_gpu = flops_model / mp;
  TimeBreakdown tb;
  tb.compute_s = flops_gpu / peak;

  // Eq. 9: parameters cross three times (forward, recompute, backward), gradients once.
  const double pg_bytes = flops_gpu / ait_param_grad_eq9(k.bsz, k.seq);
  const bool bcast = pl.fetch == ParamFetch::broadcast && k.dp > 1;
  const char* host_path = bcast ? "cpu-broadcast" : "cpu";
  const double gg = bw_of(eff, AitState::param_grad, "gpu");
  const double share_rest = (dp - 1) / dp;
  double t_param = 0, t_grad = 0;
  switch (pl.param16.tier) {
    case Tier::gpu: t_param = pl.param16.partitioned && k.dp > 1 ? transfer_s(0.75 * pg_bytes * share_rest, gg) : 0; break;
    case Tier::cpu: t_param = transfer_s(0.75 * pg_bytes, bw_of(eff, AitState::param_grad, host_path)); break;
    case Tier::nvme: t_param = transfer_s(0.75 * pg_bytes, bw_of(eff, AitState::param_grad, "nvme")); break;
  }
  switch (pl.grad16.tier) {
    case Tier::gpu:
      if (k.dp > 1) {
        // 1-bit Adam: 1 bit per fp16 element; the scales (4 B per tensor and peer) are left out here.
        // Whole gradients (all-reduce) accumulate locally and cross once per optimizer step: a
        // share of each micro-step's; partitioned ones are reduce-scattered in every micro-step.
        const double bytes = (pl.grad16.partitioned ? 1.0 : 2.0 / ga) * 0.25 * pg_bytes * share_rest;
        t_grad = transfer_s(k.what_if.onebit_adam ? onebit_bytes(bytes, 2.0, 0) : bytes, gg);
      }
      // The optimizer runs elsewhere: each rank's gradient share still crosses PCIe to it.
      if (pl.optim32.tier != Tier::gpu)
        t_grad += transfer_s(0.25 * pg_bytes,
                             bw_of(eff, AitState::param_grad, pl.optim32.tier == Tier::nvme ? "nvme" : host_path));
      break;
    case Tier::cpu: t_grad = transfer_s(0.25 * pg_bytes, bw_of(eff, AitState::param_grad, host_path)); break;
    case Tier::nvme: t_grad = transfer_s(0.25 * pg_bytes, bw_of(eff, AitState::param_grad, "nvme")); break;
  }
  tb.param_grad_s = t_param + t_grad;
  if (pl.act_ckpt.tier != Tier::gpu)
    tb.act_ckpt_s = transfer_s(flops_gpu / ait_act_ckpt_eq11(m.hidden, k.ci),
                               bw_of(eff, AitState::act_ckpt, to_string(pl.act_ckpt.tier)));
  const double overlapped = tb.param_grad_s + tb.act_ckpt_s;
  const double exposed_fb = k.prefetch_depth > 0 ? std::max(0.0, overlapped - tb.compute_s) : overlapped;

  // Eq. 10 against the aggregate bandwidth: every rank updates its partition at once.
  if (pl.optim32.tier != Tier::gpu) {
    const double opt_bytes = flops_model / ait_optimizer_eq10(k.bsz, k.seq);
    const double traffic = transfer_s(opt_bytes, bw_of(eff, AitState::optimizer, to_string(pl.optim32.tier)));
    const double adam = params_eq1(m.layers, m.hidden) / (nodes_used(c, p) * p.cpu_adam_params_per_s);
    tb.optimizer_s = std::max(traffic, adam);
    if (pl.param16.tier == Tier::gpu)  // updated fp16 parameters return to the GPU copies
      tb.refresh_s = transfer_s(0.25 * pg_bytes, bw_of(eff, AitState::param_grad, host_path));
  }
  if (k.mp > 1)  // forward 2, recompute 2, backward 2 all-reduces of (B, T, C) fp16 per layer of the stage
    tb.mp_allreduce_s = transfer_s(m.layers / pp * 6.0 * 2.0 * (mp - 1) / mp * 2.0 * k.bsz * double(k.seq) * double(m.hidden),
                                   p.gpu_gpu_Bps);
  if (pp > 1) {  // a stage's activations forward and their gradients back, 1/mp each (Megatron's scatter)
    const bool across = dp * mp >= p.gpus_per_node && p.nodes > 1;
    const double bw = across && p.inter_node_Bps > 0 ? p.inter_node_Bps : p.gpu_gpu_Bps;
    tb.p2p_s = transfer_s(2.0 * 2.0 * k.bsz * double(k.seq) * double(m.hidden) / mp, bw);
  }
  // The refresh streams chunk by chunk behind CPU Adam (ZeRO-Offload): the longer of the two counts.
  double optimizer_exposed = std::max(tb.optimizer_s, tb.refresh_s);
  switch (k.optimizer_overlap) {
    case OptimizerOverlap::none: break;
    case OptimizerOverlap::backward:  // beside backward and recompute: 3/4 of Eq. 7's computation
      optimizer_exposed = std::max(0.0, optimizer_exposed - 0.75 * tb.compute_s);
      break;
    case OptimizerOverlap::dpu:  // beside the whole forward and backward; the refresh follows them
      optimizer_exposed = std::max(0.0, tb.optimizer_s - tb.compute_s) + tb.refresh_s;
      break;
  }
  // Gradient accumulation: forward and backward `ga` times, the optimizer once; the backward
  // overlap hides it behind the last micro-step's backward only (the gradients are final there),
  // dpu behind all of them. Pipeline stages (1F1B) idle for pp - 1 micro-steps' time besides.
  const double micro_step_s = tb.compute_s + exposed_fb + tb.mp_allreduce_s + tb.p2p_s;
  tb.bubble_s = (pp - 1) * micro_step_s;
  if (ga > 1) {
    if (k.optimizer_overlap == OptimizerOverlap::dpu)
      optimizer_exposed = std::max(0.0, tb.optimizer_s - ga * tb.compute_s) + tb.refresh_s;
    tb.compute_s *= ga;
    tb.param_grad_s *= ga;
    tb.act_ckpt_s *= ga;
    tb.mp_allreduce_s *= ga;
    tb.p2p_s *= ga;
  }
  tb.exposed_s = ga * exposed_fb + optimizer_exposed + tb.mp_allreduce_s + tb.p2p_s + tb.bubble_s;
  tb.iteration_s = tb.compute_s + tb.exposed_s;
  tb.tflops_per_gpu = ga * flops_gpu / tb.iteration_s / 1e12;
  tb.samples_per_s = global_batch(k) / tb.iteration_s;
  return tb;
}

}  // namespace memwall::planner
