#include "model/schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "model/memory_plan.hpp"
#include "model/schedule_build.hpp"
#include "model/units.hpp"

namespace memwall {

const char* to_string(BufferKind k) {
  switch (k) {
    case BufferKind::params: return "params";
    case BufferKind::staged_params: return "staged_params";
    case BufferKind::grad: return "grad";
    case BufferKind::staged_grad: return "staged_grad";
    case BufferKind::ckpt: return "ckpt";
    case BufferKind::ckpt_loaded: return "ckpt_loaded";
    case BufferKind::ckpt_whole: return "ckpt_whole";
    case BufferKind::activations: return "activations";
    case BufferKind::awm: return "awm";
    case BufferKind::workspace: return "workspace";
    case BufferKind::chunk: return "chunk";
    case BufferKind::grads16: return "grads16";
    case BufferKind::params16: return "params16";
  }
  return "?";
}

namespace {

// The phases in order (schedule_build.hpp): the optimizer's chunks, dpu's delayed update, the
// micro-steps' forward and backward passes, the optimizer, the workspace; then the memory plan.
Schedule generate(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                  const HardwareProfile& profile, int rank, int dp, const MemorySizes& sizes, int stage) {
  const build::Shape sh(model, placement, config, profile, rank, dp, sizes, stage);
  Schedule s;
  s.strategy = placement.name;
  s.rank = rank;
  s.dp = dp;
  s.mp = config.mp;
  s.micro_batches = sh.micro_batches;
  s.grad_accum = sh.grad_accum;
  s.pp = sh.pp;
  s.stage = stage;
  s.model = model;
  s.placement = placement;
  s.config = config;
  s.broadcast = sh.broadcast();
  s.sizes = sizes;
  s.optimizer_overlap = config.optimizer_overlap;
  s.capacity_bytes = capacity_per_rank(config, profile);
  s.persistent_bytes = persistent_state_bytes(model, placement, config, rank, sizes, stage);
  s.ops = sh.ops;
  s.units = sh.units;
  build::Emitter e(s, sh);
  build::Builder b{sh, e, {}, {}, {}, {}, std::vector<build::Pipe>(size_t(sh.v))};
  build::plan_optimizer(b);
  // The steps' room made once (the estimate is from above, 1.4-1.9x at 1T): growing the vector
  // moved every step at each doubling and page-faulted each new array in, a third of the time a
  // large schedule took to build.
  const int blocks = sh.pp > 1 ? stage_block_count(model.layers, sh.pp, sh.v, stage) : model.layers;
  s.steps.reserve(size_t(estimated_schedule_steps(config, std::max(1, blocks), double(s.optimizer_chunks.size()))));
  build::delayed_update(b);
  // gradient accumulation: forward and backward once per micro-step, the optimizer once; a
  // pipeline stage's passes in 1F1B order (interleaved over its chunks when v > 1)
  for (const PipelinePass& pass : pipeline_order(sh.pp, sh.v, sh.grad_accum, sh.stage)) {
    e.accum = pass.micro_batch;
    if (pass.forward) build::forward(b, pass.chunk);
    else build::backward(b, pass.chunk);
  }
  e.accum = -1;
  build::optimizer(b);
  if (sh.workspace() && !s.steps.empty()) {
    const int ws = e.alloc(0, BufferKind::workspace, "workspace", Tier::gpu, sizes.workspace_bytes);
    e.free_at(e.last_step(), ws);
  }
  plan_memory(s, plan_limits(s, pinned_per_rank(config, profile)));
  return s;
}

}  // namespace

Result<bool> check_optimizer_overlap(const Placement& pl, OptimizerOverlap ov, double grad_clip) {
  if (ov == OptimizerOverlap::none) return true;
  const std::string flag = std::string("--optimizer-overlap ") + to_string(ov) + ": ";
  if (ov == OptimizerOverlap::backward && grad_clip > 0)
    return make_error(flag + "not with --grad-clip: clipping scales every gradient by the global norm, known only "
                             "once backward has made the last gradient, and this overlap updates chunks before "
                             "that (none or dpu compute the norm first)");
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
    const int blocks = stage_block_count(model.layers, std::max(1, config.pp), config.virtual_stages, stage);
    cfg = schedule_size_check(config, std::max(1, blocks), machine_memory_bytes());
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
  if (!(sizes.optim_grad_bytes >= 0 && sizes.optim_grad_bytes < sizes.optim_bytes))
    return make_error("schedule: the optimizer state's fp32 gradient must be 0 or more bytes and less than the state");
  if (Result<bool> ok = check_optimizer_overlap(placement, config.optimizer_overlap, config.grad_clip); !ok) return make_error(ok.error());
  TrainingConfig resolved_config = config;
  resolved_config.dp = dp;
  if (Result<bool> ok = check_expert_parallel(model, placement, resolved_config); !ok) return make_error(ok.error());
  return generate(model, placement, resolved_config, profile, rank, dp, sizes, stage);
}

Result<std::vector<Schedule>> build_schedules(const ModelSpec& model, const Placement& placement,
                                              const TrainingConfig& config, const HardwareProfile& profile,
                                              const MemorySizes& sizes) {
  TrainingConfig c = config;
  const int pp = std::max(1, c.pp);
  Result<int> resolved = resolve_dp(c, profile);
  if (!resolved) return make_error(resolved.error());
  const int dp = *resolved;
  c.dp = dp;
  const bool broadcast = placement.fetch == ParamFetch::broadcast && dp > 1;
  if (pp > 1)
    if (Result<TrainingConfig> ok = schedule_size_check(c, model.layers, machine_memory_bytes()); !ok)
      return make_error(ok.error());
  std::vector<Schedule> out;
  for (int r = 0; r < (broadcast ? dp : pp); ++r) {
    Result<Schedule> s = build_schedule(model, placement, c, profile, broadcast ? r : 0, sizes, broadcast ? 0 : r);
    if (!s) return make_error(s.error());
    const bool overflow = s->overflow.has_value();
    out.push_back(std::move(s).value());
    if (overflow) break;
  }
  return out;
}

namespace {

// Collects failures, at most 20, each naming its step.
struct Failures {
  std::vector<std::string> bad;
  void add(const Step& st, const std::string& what) {
    if (bad.size() < 20)
      bad.push_back("step " + std::to_string(st.id) + " (" + to_string(st.kind) + " " + st.name + "): " + what);
  }
  void add(const std::string& what) {
    if (bad.size() < 20) bad.push_back(what);
  }
};

// Ids in order, dependencies backwards, indices inside their tables, transfers with bytes, tiers
// and, between GPUs, a collective spec.
void check_steps(const Schedule& s, Failures& f) {
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    if (st.id != int(i)) f.add(st, "id out of order");
    for (int d : st.deps)
      if (d < 0 || d >= st.id) f.add(st, "dependency " + std::to_string(d) + " does not point to an earlier step");
    if (st.link != LinkClass::none) {
      if (!(st.bytes > 0) && st.collective.kind != CollectiveKind::broadcast) f.add(st, "moves no bytes");
      if (!is_collective(st) && st.src == st.dst) f.add(st, "source and destination are the same tier");
    }
    if ((st.link == LinkClass::gpu_gpu || st.link == LinkClass::network) && !is_collective(st))
      f.add(st, "crosses between GPUs without a collective spec");
    if (st.unit >= int(s.units.size())) f.add(st, "unit " + std::to_string(st.unit) + " out of range");
    if (st.chunk >= int(s.optimizer_chunks.size())) f.add(st, "chunk " + std::to_string(st.chunk) + " out of range");
    if (st.op >= int(s.ops.size()) || (st.kind == StepKind::compute && st.op < 0)) f.add(st, "no operator");
  }
}

// Buffers: made once, used only while alive, given back once; every compute finds its fetched
// parameters and waits for the last hop that filled them; a release frees a fetched buffer.
void check_buffers(const Schedule& s, Failures& f) {
  auto ok = [&](int b) { return b >= 0 && size_t(b) < s.buffers.size(); };
  auto bname = [&](int b) { return ok(b) ? s.buffers[size_t(b)].name : "#" + std::to_string(b); };
  bool params_fetched = false;
  for (const Step& st : s.steps)
    params_fetched = params_fetched || (st.kind == StepKind::fetch && st.unit >= 0 && st.phase != Phase::optimizer);
  std::vector<int> writer(s.buffers.size(), -1);   // the latest fetch that filled a parameter buffer
  std::vector<char> ordered(s.buffers.size(), 0);  // a compute already waited for that fetch
  std::vector<int> made(s.buffers.size(), -1), given(s.buffers.size(), -1);
  for (const Step& st : s.steps) {
    for (int b : st.allocs) {
      if (!ok(b)) {
        f.add(st, "makes buffer " + bname(b) + ", which the schedule does not have");
        continue;
      }
      if (!(s.buffers[size_t(b)].bytes >= 0)) f.add(st, "buffer " + bname(b) + " has no size");
      if (made[size_t(b)] >= 0) f.add(st, "makes buffer " + bname(b) + ", which already exists");
      made[size_t(b)] = st.id;
    }
    std::vector<int> used = st.uses;
    used.push_back(st.src_buf);
    used.push_back(st.dst_buf);
    for (int b : used)
      if (b >= 0 && (!ok(b) || made[size_t(b)] < 0 || given[size_t(b)] >= 0))
        f.add(st, "uses buffer " + bname(b) + ", which does not exist");
    if (st.kind == StepKind::fetch && st.phase != Phase::optimizer && st.unit >= 0 && ok(st.dst_buf)) {
      writer[size_t(st.dst_buf)] = st.id;
      ordered[size_t(st.dst_buf)] = 0;
    } else if (st.kind == StepKind::release) {
      if (st.frees.empty() || !ok(st.frees.front()) || writer[size_t(st.frees.front())] < 0)
        f.add(st, "releases " + st.name + ", which is not on the GPU");
    } else if (st.kind == StepKind::compute && st.unit >= 0 && params_fetched) {
      const int b = st.src_buf;
      if (!ok(b) || writer[size_t(b)] < 0) {
        f.add(st, "parameters of " + st.name + " are not on the GPU");
      } else if (!ordered[size_t(b)]) {
        // The first compute after a fetch must wait for its last hop; later ones (the l2l
        // micro-batch loop) follow that compute.
        if (std::find(st.deps.begin(), st.deps.end(), writer[size_t(b)]) == st.deps.end())
          f.add(st, "does not wait for the fetch of " + bname(b) + " (step " + std::to_string(writer[size_t(b)]) + ")");
        ordered[size_t(b)] = 1;
      }
    }
    for (int b : st.frees) {
      if (!ok(b) || made[size_t(b)] < 0 || given[size_t(b)] >= 0) {
        f.add(st, "gives back buffer " + bname(b) + ", which does not exist");
        continue;
      }
      given[size_t(b)] = st.id;
    }
  }
  for (size_t b = 0; b < s.buffers.size(); ++b) {
    if (made[b] < 0) f.add("buffer " + s.buffers[b].name + ": never made");
    else if (given[b] < 0)
      f.add("buffer " + s.buffers[b].name + ": made at step " + std::to_string(made[b]) + " but never given back");
  }
}

// The optimizer overlap's rules: a CPU update waits for something (backward: its gradients); dpu's
// updates come before the first compute and its parameter copies to the GPU after the last.
void check_overlap(const Schedule& s, Failures& f) {
  int first_compute = -1, last_compute = -1;
  for (const Step& st : s.steps)
    if (st.kind == StepKind::compute) {
      if (first_compute < 0) first_compute = st.id;
      last_compute = st.id;
    }
  for (const Step& st : s.steps) {
    const bool cpu_update = st.kind == StepKind::optimizer && st.src == Tier::cpu;
    if (cpu_update && s.optimizer_overlap != OptimizerOverlap::dpu && st.deps.empty())
      f.add(st, "an update that waits for no gradient");
    if (s.optimizer_overlap != OptimizerOverlap::dpu) continue;
    if (cpu_update && st.id > first_compute) f.add(st, "dpu: the delayed update must come before the first compute");
    if (st.kind == StepKind::fetch && st.phase == Phase::optimizer && st.hop == Hop::cg &&
        std::find(st.deps.begin(), st.deps.end(), last_compute) == st.deps.end())
      f.add(st, "dpu: the updated parameters may reach the GPU only after the last compute");
  }
}

}  // namespace

std::vector<std::string> check_invariants(const Schedule& s) {
  Failures f;
  check_steps(s, f);
  check_buffers(s, f);
  check_overlap(s, f);
  return f.bad;
}

std::string schedule_text(const Schedule& s) {
  std::string out;
  char line[512];
  // the columns: step id, phase, kind (and hop), what it works on, FLOPs / parameters / bytes, the
  // route (from->to and link class), and the steps it waits for
  std::snprintf(line, sizeof line, "%5s %-9s %-20s %-28s %12s  %-22s %s\n", "step", "phase", "kind", "operand", "amount",
                "route", "after");
  out += line;
  for (const Step& st : s.steps) {
    std::string what = to_string(st.kind);
    if (st.hop != Hop::none) what += std::string(".") + to_string(st.hop);
    std::string op = st.name;
    if (st.tile >= 0 && st.kind == StepKind::compute && st.op >= 0)
      op = unit_name(s.ops[size_t(st.op)].role, s.ops[size_t(st.op)].block, st.tile, s.ops[size_t(st.op)].copies,
                     s.config.tiling_factor);
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
