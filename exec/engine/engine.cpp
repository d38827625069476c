// The engine's public face: plan_rank (this rank's schedules, as built and checked), create (the
// tiers, the backend, the collectives, CPU Adam and the GPT's operators for a plan), one iteration
// (exec/engine/dispatcher.hpp runs it), and what callers read back (states, stats, traces).
#include "exec/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "exec/engine/checkpoint.hpp"
#include "exec/engine/context.hpp"
#include "exec/engine/dispatcher.hpp"
#include "model/memory.hpp"
#include "model/memory_plan.hpp"
#include "model/units.hpp"

namespace memwall::exec {

using Clock = std::chrono::steady_clock;

MemorySizes executor_sizes(const GptConfig& model, const TrainingConfig& config, adam::DType precision,
                           int micro_batches) {
  MemorySizes z;
  z.param_bytes = double(adam::dtype_bytes(precision));
  z.optim_bytes = 12;  // fp32 master, momentum, variance: CPU Adam reads 16-bit gradients directly
  z.optim_grad_bytes = 0;
  z.act_bytes = 4;     // activations and checkpoints are fp32 (the kernels compute in fp32)
  // every mp rank's slice has the same shapes: rank 0's
  z.workspace_bytes = double(GptOps::workspace_bytes(mp_slice(model, std::max(1, config.mp), 0), int(config.bsz),
                                                     int(config.seq), config.ci, micro_batches, config.tiling_factor,
                                                     config.pp > 1 ? std::max(1, config.virtual_stages) : 0));
  z.host_align_bytes = double(io::kIoAlignment);  // O_DIRECT: the pinned buffers NVMe reads and writes
  z.device_align_bytes = 256;                     // what the kernels and copies expect
  return z;
}

Result<MemorySizes> schedule_sizes(const HardwareProfile& profile, const ModelSpec& model, const Placement& placement,
                                   const TrainingConfig& config) {
  if (profile.executor_backend.empty()) return MemorySizes{};
  Result<adam::DType> precision = adam::parse_dtype(profile.executor_precision);
  if (!precision) return make_error(profile.source + ": executor.precision: " + precision.error());
  return executor_sizes(gpt_config(model), config, *precision, placement.layer_major ? std::max(1, config.micro_batches) : 1);
}

EngineContext::~EngineContext() {
  if (be) be->ops().synchronize(be->ctx());
  lane.reset();
  coll.reset();
  if (be) {
    for (Event e : event_pool) be->ops().event_destroy(be->ctx(), e);
    gpt.reset();
  }
}

Event EngineContext::take_event() {
  if (event_pool.empty()) return k().event_create(cx());
  Event e = event_pool.back();
  event_pool.pop_back();
  return e;
}

namespace {

// What the executor runs, checked before a schedule is built: the job's ranks, one device each.
Result<bool> normalise(EngineOptions& o, int& rank, int& dp, int& mp_rank, int& stage) {
  // capacity_bytes: what the backend may allocate in all. The memory plan fills it less what this
  // backend keeps (its workspaces: cuBLAS's), as gpu.reserve: the schedule's capacity is then
  // capacity_per_rank's, the one formula the planner uses. The profile's context and communicator
  // parts are not this process's to count: the backend's capacity is device memory left free with
  // its context made, less a margin for NCCL (exec/backend).
  if (o.capacity_bytes == 0) o.capacity_bytes = std::size_t(capacity_per_rank(o.config, o.profile)[size_t(Tier::gpu)]);
  o.profile.gpu_memory_bytes = double(o.capacity_bytes);
  o.profile.gpu_reserve = GpuReserve{0, double(backend_reserved_bytes(o.backend, o.capacity_bytes)), 0, true};
  o.config.seq = o.model.max_seq;
  const int mp = o.config.mp = std::max(1, o.config.mp);
  if (mp > 1) {
    if (Result<bool> ok = check_mp_slicing(o.model, mp); !ok) return ok;
    // the executor's head computes every logit on each mp rank (no vocabulary-parallel cross-entropy)
    o.config.embedding_replicated = true;
    if (o.placement.act_ckpt.partitioned &&
        long(o.config.bsz) * o.model.max_seq * o.model.hidden % mp != 0)
      return make_error("placement: act_ckpt partitioned across " + std::to_string(mp) +
                        " tensor slices needs bsz x seq x hidden divisible by " + std::to_string(mp));
  }
  const int pp = o.config.pp = std::max(1, o.config.pp);
  if (pp > 1) {
    const std::string why = "--pp " + std::to_string(pp) + ": ";
    if (pp > o.model.layers)
      return make_error(why + "more stages than the model's " + std::to_string(o.model.layers) + " blocks");
    if (mp > 1 && long(o.config.bsz) * o.model.max_seq * o.model.hidden % mp != 0)
      return make_error(why + "each of the " + std::to_string(mp) + " tensor slices sends 1/mp of a stage's "
                        "activations; needs bsz x seq x hidden divisible by " + std::to_string(mp));
    if (o.placement.layer_major)
      return make_error(why + "l2l runs one stage's layers for every micro-batch; not with pipeline stages");
    if (o.serial)
      return make_error(why + "--serial waits for each send before the next step, but a stage's send completes only "
                        "when its neighbour reaches the matching receive later in its own order; run without --serial");
  }
  MpiWorld& world = MpiWorld::get();
  if (world.size() % (mp * pp) != 0)
    return make_error("--mp/--pp: " + std::to_string(mp) + " x " + std::to_string(pp) +
                      " ranks per data-parallel rank do not divide this job's " + std::to_string(world.size()) +
                      " ranks (start it with mpirun -np dp x mp x pp)");
  // Megatron-LM's order: the mp slices of a dp rank consecutive, a stage's dp x mp ranks next, stages last
  const int per_stage = world.size() / pp;
  stage = world.rank() / per_stage;
  rank = world.rank() % per_stage / mp;
  mp_rank = world.rank() % mp;
  dp = per_stage / mp;
  if (o.config.dp > 0 && o.config.dp != dp)
    return make_error("--dp: " + std::to_string(o.config.dp) + " data-parallel ranks asked, this job has " +
                      std::to_string(dp) + (mp * pp > 1 ? " (of mp " + std::to_string(mp) + " x pp " + std::to_string(pp) + ")" : "") +
                      " (start it with mpirun -np " + std::to_string(o.config.dp * mp * pp) + ")");
  if (o.profile.total_gpus() < world.size()) {
    // a profile `memwall run` executes describes this machine: one device per rank started on it
    if (o.profile.executor_backend.empty() || o.profile.nodes != 1)
      return make_error("--profile " + o.profile.name + ": " + std::to_string(o.profile.total_gpus()) +
                        " GPUs, but this job has " + std::to_string(world.size()) + " ranks (one GPU each)");
    o.profile.gpus_per_node = world.size();
  }
  o.config.dp = dp;
  if (o.config.bsz != std::floor(o.config.bsz) || o.config.bsz < 1)
    return make_error("--bsz: the executor needs a whole micro-batch >= 1, got " + format_g(o.config.bsz));
if (o.backend == "cpu" && o.precision == adam::DType::fp16)
    return make_error("precision: the cpu backend stores bf16 or fp32 parameters (fp16 needs loss scaling), got fp16");
  for (const ParamGroup& g : gpt_param_groups(mp_slice(o.model, mp, 0)))
    if (g.linear && o.config.tiling_factor > 1 && g.out_features % o.config.tiling_factor != 0)
      return make_error("--tiling: " + std::to_string(o.config.tiling_factor) +
                        " must divide the output features of every linear layer (" + g.name + " has " +
                        std::to_string(g.out_features) + ")");
  const adam::LrSchedule& ls = o.lr_schedule;
  if (ls.warmup_steps < 0 || ls.decay_steps < 0 || !(ls.min_lr >= 0 && ls.min_lr <= o.lr))
    return make_error("lr schedule: expected warm-up and decay steps >= 0 and 0 <= min_lr <= lr (" + format_g(o.lr) +
                      "), got warm-up " + std::to_string(ls.warmup_steps) + ", decay " +
                      std::to_string(ls.decay_steps) + ", min_lr " + format_g(ls.min_lr));
  if (ls.decay != adam::LrDecay::constant && ls.decay_steps <= ls.warmup_steps)
    return make_error("lr schedule: a " + std::string(adam::to_string(ls.decay)) +
                      " decay must end after the warm-up: warmup_steps " + std::to_string(ls.warmup_steps) +
                      ", decay_steps " + std::to_string(ls.decay_steps) +
                      " (the run's steps unless set); set decay_steps or fewer warm-up steps");
  if (o.threads < 0 || o.threads > 4096)
    return make_error("--threads: expected 0 (fit the cores other processes leave free) to 4096, got " +
                      std::to_string(o.threads));
  Result<Placement> pl = validate(o.placement);
  if (!pl) return make_error(pl.error());
  return true;
}

std::string parts(const TierMemory& tm) {
  std::string out;
  for (const MemoryPart& p : tm.parts) out += (out.empty() ? "" : ", ") + p.what + " " + format_bytes(p.bytes);
  return out;
}

// Whether the schedule fits: every tier (the memory model at the executor's sizes says what fills
// it, the schedule's walk and plan whether it fits) and the pinned budget (the plan's CPU arena).
Result<bool> check_fit(const EngineOptions& o, const Schedule& s) {
  const std::string hint = "; run `memwall plan` for a placement, batch, checkpoint interval and tiling that fit";
  const MemoryModel mm = memory_model(gpt_model_spec(o.model), o.placement, s.config, o.profile, s.rank, s.sizes);
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
    const TierMemory& tm = mm.of(t);
    if (tm.fits() && !(s.overflow && s.overflow->tier == t)) continue;
    const std::string why = s.overflow ? s.overflow->message
                                       : std::string("out of memory on ") + to_string(t) + ": needs " +
                                             format_bytes(tm.peak_bytes) + ", capacity " + format_bytes(tm.capacity_bytes) +
                                             " per rank";
    const std::size_t reserved = backend_reserved_bytes(o.backend, o.capacity_bytes);
    const std::string kept = t == Tier::gpu && reserved > 0
                                 ? "; the device's " + format_bytes(double(o.capacity_bytes)) + " less " +
                                       format_bytes(double(reserved)) + " the " + o.backend +
                                       " backend keeps for its workspaces"
                                 : std::string();
    return make_error("does not fit: " + why + " (" + (tm.moment.empty() ? "" : "at the " + tm.moment + ": ") + parts(tm) +
                      ")" + kept + hint);
  }
  const double pinned = pinned_per_rank(s.config, o.profile);
  const double need = double(s.arena_bytes[size_t(Tier::cpu)]);
  if (need > pinned + 0.5)
    return make_error("pinned budget too small: the schedule's CPU buffers need " + format_bytes(need) + " (" +
                      std::to_string(std::llround(need)) + " bytes, as the memory plan lays them out) at once (" +
                      parts(mm.of(Tier::cpu)) + "), the profile " + o.profile.name + " gives " + format_bytes(pinned) +
                      " per GPU (cpu.pinned_budget)");
  return true;
}

Result<Schedule> build_checked(const EngineOptions& o, int rank, const TrainingConfig& c, int stage) {
  const int micro_batches = o.placement.layer_major ? std::max(1, c.micro_batches) : 1;
  const MemorySizes sizes = executor_sizes(o.model, c, o.precision, micro_batches);
  Result<Schedule> s = build_schedule(gpt_model_spec(o.model), o.placement, c, o.profile, rank, sizes, stage);
  if (!s) return make_error(s.error());
  if (std::vector<std::string> bad = check_invariants(*s); !bad.empty())
    return make_error("internal error: the schedule breaks an invariant: " + bad.front());
  if (Result<bool> r = check_fit(o, *s); !r) return make_error(r.error());
  return s;
}

// Every rank must run the same schedule with the same collectives, or the job would hang or mix
// data: a hash of what every rank must agree on, compared across ranks before step 0 (as
// DeepSpeed's assert_ints_same_as_other_ranks).
Result<bool> check_ranks_agree(EngineContext& e) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mixin = [&h](const std::string& text) {
    for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
  };
  const EngineOptions& o = e.o;
  mixin(std::to_string(o.model.layers) + "/" + std::to_string(o.model.hidden) + "/" + std::to_string(o.model.heads) + "/" +
        std::to_string(o.model.max_seq) + "/" + std::to_string(o.model.vocab) + "/" +
        gpt_model_spec(o.model).kind_words() + "/" + format_g(o.model.rope_theta));
  for (State st : {State::param16, State::grad16, State::optim32, State::act_ckpt})
    mixin(std::string(to_string(e.tier(st))) + (o.placement.of(st).partitioned ? "p" : "w"));
  mixin(format_g(o.config.bsz) + "/" + std::to_string(o.config.ci) + "/" + std::to_string(o.config.tiling_factor) + "/" +
        std::to_string(o.config.prefetch_depth) + "/" + std::to_string(o.config.micro_batches) + "/" +
        std::string(adam::dtype_name(o.precision)) + "/" + std::to_string(o.seed) + "/" + format_g(o.lr));
  for (const Schedule* s : {&e.plan.schedule, e.plan.warmup ? &*e.plan.warmup : nullptr}) {
    if (!s) continue;
    for (const Step& st : s->steps) {
      if (!is_collective(st)) continue;
      // what every rank's call must agree on (a broadcast's received bytes differ: its root gets none)
      const CollectiveSpec& c = st.collective;
      mixin(step_label(st) + "/" + to_string(c.kind) + "/" + std::to_string(c.root) + "/" + format_g(c.bytes_per_rank));
    }
  }
  Result<std::vector<std::uint64_t>> all = e.everyone()->all_gather_u64(h);
  if (!all) return make_error(all.error());
  // a pipeline's stages run schedules of their own: each rank against its stage's first
  const std::size_t per_stage = all->size() / std::size_t(e.pp);
  for (std::size_t r = 1; r < all->size(); ++r)
    if ((*all)[r] != (*all)[r / per_stage * per_stage])
      return make_error("rank " + std::to_string(r) + " runs another model, placement, training config or schedule "
                        "than rank " + std::to_string(r / per_stage * per_stage) +
                        " (give every rank the same flags, run config and plan)");
  return true;
}

// The backend, wrapped when a test asks.
Result<std::unique_ptr<Backend>> make_backend(const EngineOptions& o, int threads) {
  BackendOptions bo;
  bo.threads = threads;
  bo.capacity_bytes = o.capacity_bytes;  // normalised: the memory plan's share plus the backend's own
  bo.compute = o.compute;
  // one GPU per rank of a node: its index among the node's ranks (MPI's shared-memory split, not
  // one MPI implementation's environment variable)
  if (o.backend == "cuda") bo.device = MpiWorld::get().node_rank();
  Result<std::unique_ptr<Backend>> b = create_backend(o.backend, bo);
  if (!b) return make_error("backend: " + b.error());
  std::unique_ptr<Backend> be = std::move(b).value();
  if (o.wrap_backend) be = o.wrap_backend(std::move(be));
  return be;
}

// Host threads: what options.threads asks for, or the cores other processes leave free, measured
// over the engine's own making (at least 0.1 s; its own work is not the others').
Result<std::optional<adam::LoadWindow>> begin_host_threads(EngineContext& e) {
  EngineContext::HostThreads& h = e.host;
  h.allowed = adam::cores_allowed();
  h.fitted = e.o.threads == 0;
  h.job_peers = adam::sharing_cpus(MpiWorld::get().node_peer_pids(), h.allowed);
  h.threads = h.fitted ? std::max(1, h.allowed.quota_cores / (1 + int(h.job_peers.size()))) : e.o.threads;
  if (!h.fitted) return std::optional<adam::LoadWindow>{};
  Result<adam::LoadWindow> w = adam::begin_load_window(MpiWorld::get().node_peer_pids());
  if (!w) return make_error("threads: " + w.error() + " (give --threads N to choose them)");
  return std::optional<adam::LoadWindow>(std::move(w).value());
}

Result<bool> fit_host_threads(EngineContext& e, const std::optional<adam::LoadWindow>& window) {
  EngineContext::HostThreads& h = e.host;
  if (!window) return true;
  Result<adam::CpuLoad> load = adam::end_load_window(*window, 0.1);
  if (!load) return make_error("threads: " + load.error() + " (give --threads N to choose them)");
  h.load = *load;
  h.threads = adam::fit_threads(h.load);
  Result<adam::CpuSample> now = adam::sample_cpu(h.allowed, h.job_peers);
  if (!now) return make_error("threads: " + now.error());
  h.looked = *now;
  return true;
}

void apply_host_threads(EngineContext& e) {
  e.adam->set_threads_in_use(e.host.threads);
  if (e.k().set_host_threads) e.k().set_host_threads(e.cx(), e.host.threads);
}

// After an iteration: look at the load again once 0.2 s have passed since the last look.
void refit_host_threads(EngineContext& e) {
  EngineContext::HostThreads& h = e.host;
  const double wall_s = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  if (!h.fitted || wall_s - h.looked.wall_s < 0.2) return;  // /proc read only once 0.2 s have passed
  Result<adam::CpuSample> now = adam::sample_cpu(h.allowed, h.job_peers);
  if (!now) return;
  h.load = adam::load_between(h.looked, *now, h.allowed.quota_cores);
  h.looked = *now;
  const int t = adam::fit_threads(h.load);
  if (t == h.threads) return;
  h.threads = t;
  apply_host_threads(e);
}

// dpu: the delayed update's schedule from step warmup + 1 on (its first iteration has no pending
// gradients: its updates only copy the parameters), the ordinary one before.
void choose_schedule(EngineContext& e) {
  e.skip_update = false;
  if (!e.plan.warmup) return;
  const bool want = e.iteration >= e.o.config.dpu_warmup;
  if (want != e.dpu_active) e.skip_update = want;
  e.dpu_active = want;
  e.sched = want ? &e.plan.schedule : &*e.plan.warmup;
  e.tables = want ? &e.main_tables : &e.warmup_tables;
}

// Values laid out as the optimizer slices are (this rank's), back in the parameter array's order;
// with partitioned states every rank's slices are summed into place (zeros elsewhere), so every
// rank gets the whole array.
Result<std::vector<float>> assemble(EngineContext& e, const std::vector<float>& slices) {
  const Tiers& t = e.tiers;
  std::vector<float> tiled(t.whole_elems(), 0.0f);
  for (const UnitLayout& u : t.units()) {
    const std::size_t at = u.whole_at + (t.sharded(State::optim32) ? u.from : 0);
    std::copy_n(slices.begin() + long(t.opt_at(u)), t.opt_len(u), tiled.begin() + long(at));
  }
  if (t.sharded(State::optim32))
    if (Result<bool> r = e.coll->all_reduce_sum_host(tiled.data(), tiled.size()); !r) return make_error(r.error());
  std::vector<float> flat(t.whole_elems());
  std::vector<bool> seen(t.groups().size(), false);
  for (const UnitLayout& u : t.units()) {  // a group's first unit (tile 0) starts its tile-major layout
    if (seen[u.group]) continue;
    seen[u.group] = true;
    const ParamGroup& g = t.groups()[u.group];
    from_tile_major(g, g.linear ? e.o.config.tiling_factor : 1, tiled.data() + u.whole_at, flat.data() + g.offset);
  }
  return flat;
}

}  // namespace

Result<Schedule> rank_schedule(const EngineOptions& normalised, int rank, int stage) {
  return build_checked(normalised, rank, normalised.config, stage);
}

Result<RankPlan> plan_rank(const EngineOptions& options) {
  RankPlan p;
  p.options = options;
  if (Result<bool> r = normalise(p.options, p.rank, p.dp, p.mp_rank, p.stage); !r) return make_error(r.error());
  const EngineOptions& o = p.options;
  Result<Schedule> s = build_checked(o, p.rank, o.config, p.stage);
  if (!s) return make_error(s.error());
  p.schedule = std::move(s).value();
  if (o.config.optimizer_overlap == OptimizerOverlap::dpu) {  // warm-up steps run the ordinary schedule
    TrainingConfig plain = o.config;
    plain.optimizer_overlap = OptimizerOverlap::none;
    Result<Schedule> warm = build_checked(o, p.rank, plain, p.stage);
    if (!warm) return make_error(warm.error());
    p.warmup = std::move(warm).value();
  }
  return p;
}

Engine::Engine(std::unique_ptr<EngineContext> ctx) : ctx_(std::move(ctx)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
  Result<RankPlan> plan = plan_rank(options);
  if (!plan) return make_error(plan.error());
  return create(std::move(plan).value());
}

Result<std::unique_ptr<Engine>> Engine::create(RankPlan plan) {
  auto ctx = std::make_unique<EngineContext>();
  EngineContext& e = *ctx;
  e.o = plan.options;
  Result<std::optional<adam::LoadWindow>> load_window = begin_host_threads(e);
  if (!load_window) return make_error(load_window.error());
  e.rank = plan.rank;
  e.dp = plan.dp;
  e.mp = std::max(1, e.o.config.mp);
  e.mp_rank = plan.mp_rank;
  e.pp = std::max(1, e.o.config.pp);
  e.stage = plan.stage;
  e.world_rank = e.world_rank_of(e.stage, e.rank, e.mp_rank);
  e.world = e.dp * e.mp * e.pp;
  e.slice = mp_slice(e.o.model, e.mp, e.mp_rank);
  e.plan = std::move(plan);
  if (MpiWorld::get().rank() != e.world_rank || MpiWorld::get().size() != e.world)
    return make_error("internal error: the plan is for rank " + std::to_string(e.world_rank) + " of " +
                      std::to_string(e.world) + ", not this process");
  if (Result<bool> r = e.tiers.lay_out(e.o, e.slice, e.rank, e.dp, e.world_rank, e.plan.schedule); !r)
    return make_error(r.error());
  std::vector<const Schedule*> plans = {&e.plan.schedule};
  e.main_tables = dispatch_tables(e.plan.schedule, e.o.profile);
  if (e.plan.warmup) {
    plans.push_back(&*e.plan.warmup);
    e.warmup_tables = dispatch_tables(*e.plan.warmup, e.o.profile);
  }
  choose_schedule(e);  // iteration 0
  if (!e.plan.warmup) {
    e.sched = &e.plan.schedule;
    e.tables = &e.main_tables;
  }
  if (e.world > 1) {
    // the dp group (the ranks of this mp rank's slice) and the mp group (this dp rank's slices);
    // at mp 1 the dp group is the world
    // (and the pp group: this dp rank's and mp rank's stages, ordered by stage)
    auto group = [&](int color, int key) { return make_mpi_collectives(e.o.stall_timeout_s, color, key); };
    const bool split = e.mp > 1 || e.pp > 1;
    Result<std::unique_ptr<Collectives>> c = split ? group(e.stage * e.mp + e.mp_rank, e.rank) : group(-1, 0);
    if (!c) return make_error(c.error());
    if (split) {
      Result<std::unique_ptr<Collectives>> m = group(e.stage * e.dp + e.rank, e.mp_rank),
                                           q = group(e.rank * e.mp + e.mp_rank, e.stage), w = group(-1, 0);
      if (!m) return make_error(m.error());
      if (!q) return make_error(q.error());
      if (!w) return make_error(w.error());
      if (e.mp > 1) e.mp_coll = std::move(m).value();
      if (e.pp > 1) e.pp_coll = std::move(q).value();
      e.world_coll = std::move(w).value();
      if (e.pp > 1 && e.o.model.tied_embeddings) {  // every rank splits; a middle stage's group is its own
        const bool ends = e.stage == 0 || e.stage == e.pp - 1;
        Result<std::unique_ptr<Collectives>> t =
            group(ends ? e.rank * e.mp + e.mp_rank : e.dp * e.mp + e.world_rank, e.stage);
        if (!t) return make_error(t.error());
        if (ends) e.tied_coll = std::move(t).value();
      }
    }
    if (e.dp > 1) e.coll = std::move(c).value();
    if (Result<bool> r = check_ranks_agree(e); !r) return make_error(r.error());
    auto watch = std::make_shared<PeerWatch>();
    e.peer_progress = [watch] {
      watch->moved();
      return watch->signature();
    };
    e.describe_peers = [watch] { return watch->waiting_for(); };
    e.publish_progress = [](std::uint64_t n) { MpiWorld::get().publish_progress(n); };
  }
  adam::AdamOptions ao;
  ao.lr = e.o.lr;
  ao.beta1 = e.o.beta1;
  ao.beta2 = e.o.beta2;
  ao.eps = e.o.eps;
  ao.weight_decay = e.o.weight_decay;
  ao.decoupled_weight_decay = true;
  // the pool as large as the fit may grow (every core allowed), the threads in use the fit
  Result<adam::CpuAdam> a = adam::CpuAdam::create(ao, e.host.threads);
  if (!a) return make_error("adam: " + a.error());
  e.adam = std::make_unique<adam::CpuAdam>(std::move(a).value());
  e.lane = std::make_unique<HostLane>();
  Result<std::unique_ptr<Backend>> be = make_backend(e.o, e.host.threads);
  if (!be) return make_error(be.error());
  e.be = std::move(be).value();
  if (Result<bool> r = e.tiers.make(*e.be, plans); !r) return make_error(r.error());
  // The GPT's activations live in the plan's workspace buffer: the same place in every schedule.
  auto workspace = [](const Schedule& s) {
    for (std::size_t i = 0; i < s.buffers.size(); ++i)
      if (s.buffers[i].kind == BufferKind::workspace) return int(i);
    return -1;
  };
  const int ws = workspace(e.plan.schedule);
  if (ws < 0) return make_error("internal error: the schedule has no activation workspace");
  if (e.plan.warmup && (workspace(*e.plan.warmup) < 0 ||
                        e.plan.warmup->buffers[size_t(workspace(*e.plan.warmup))].offset != e.plan.schedule.buffers[size_t(ws)].offset))
    return make_error("internal error: the warm-up and delayed-update schedules place the workspace apart");
  const int micro_batches = e.o.placement.layer_major ? std::max(1, e.o.config.micro_batches) : 1;
  Result<std::unique_ptr<GptOps>> g =
      GptOps::create(*e.be, e.slice, int(e.o.config.bsz), int(e.o.config.seq), e.o.config.ci, micro_batches,
                     e.o.config.tiling_factor, e.tiers.buffer(e.plan.schedule, ws),
                     std::size_t(e.plan.schedule.sizes.workspace_bytes),
                     e.pp > 1 ? std::max(1, e.o.config.virtual_stages) : 0);
  if (!g) return make_error(g.error());
  e.gpt = std::move(g).value();
  e.gpt->set_stage(stage_chunks(e.o.model.layers, e.pp, std::max(1, e.o.config.virtual_stages), e.stage));
  Result<Stream> s1 = e.k().stream_create(e.cx()), s2 = e.k().stream_create(e.cx());
  if (!s1 || !s2) return make_error("backend: cannot create copy streams");
  e.h2d = *s1;
  e.d2h = *s2;
  e.gpt->set_data_parallel(e.dp, std::max(1, e.o.config.grad_accum));
  if (e.o.backend == "cuda") {  // NCCL between the GPUs of each group, bootstrapped over its MPI
    for (auto [coll, boot] :
         {std::pair{&e.coll, &e.boot}, std::pair{&e.mp_coll, &e.mp_boot}, std::pair{&e.pp_coll, &e.pp_boot},
          std::pair{&e.tied_coll, &e.tied_boot}}) {
      if (!*coll) continue;
      Result<std::unique_ptr<Collectives>> c = make_nccl_collectives(*e.be, **coll);
      if (!c) return make_error(c.error());
      *boot = std::move(*coll);
      *coll = std::move(c).value();
    }
  }
  if (Result<bool> r = e.tiers.initialise(*e.adam); !r) return make_error(r.error());
  if (e.o.keep_gradients) e.grads_kept.assign(e.tiers.elems_of(State::optim32), 0.0f);
  e.norm.units.assign(e.tiers.units().size(), 0.0);
  // sum_squares' parts go through the fp32 gradient staging, idle once the gradients are final
  e.norm.parts = int(std::clamp<std::size_t>(e.gpt->staging_elems() * sizeof(float) / sizeof(double), 1, 64));
  if (Result<bool> r = fit_host_threads(e, *load_window); !r) return make_error(r.error());
  apply_host_threads(e);
  return std::unique_ptr<Engine>(new Engine(std::move(ctx)));
}

const Schedule& Engine::schedule() const { return ctx_->plan.schedule; }
const RankPlan& Engine::plan() const { return ctx_->plan; }
const BackendCaps& Engine::backend_caps() const { return ctx_->be->caps(); }
std::size_t Engine::num_params() const {
  std::size_t n = 0;
  for (const ParamTensor& t : gpt_param_tensors(ctx_->o.model)) n += t.elems;
  return n;
}
int Engine::rank() const { return ctx_->rank; }
int Engine::ranks() const { return ctx_->dp; }
int Engine::tokens_per_iteration() const {
  return micro_batches_per_iteration() * int(ctx_->o.config.bsz) * ctx_->o.model.max_seq;
}
int Engine::micro_batches_per_iteration() const {
  return ctx_->sched->micro_batches * std::max(1, ctx_->sched->grad_accum);
}

Result<IterationReport> Engine::step(const std::vector<int>& tokens, const std::vector<int>& targets) {
  EngineContext& e = *ctx_;
  const int micro_batches = micro_batches_per_iteration();
  const std::size_t per_mb = std::size_t(e.o.config.bsz) * std::size_t(e.o.model.max_seq);
  if (tokens.size() != per_mb * std::size_t(micro_batches) || targets.size() != tokens.size())
    return make_error("step: expected " + std::to_string(per_mb * std::size_t(micro_batches)) +
                      " tokens and targets, got " + std::to_string(tokens.size()));
  for (const std::vector<int>* v : {&tokens, &targets})
    for (int t : *v)
      if (t < 0 || t >= e.o.model.vocab)
        return make_error(std::string("step: ") + (v == &tokens ? "token " : "target ") + std::to_string(t) +
                          " outside the vocabulary");
  const auto t0 = Clock::now();
  // each micro-step's embedding copies its tokens and targets; its LM head leaves its losses here
  e.batch_tokens = tokens.data();
  e.batch_targets = targets.data();
  e.step_losses.assign(tokens.size(), 0.0f);
  if (e.tier(State::grad16) == Tier::gpu)
    e.k().memset_zero(e.cx(), e.tiers.state_ptr(State::grad16), e.tiers.elems_of(State::grad16) * e.tiers.elem_bytes());
  e.k().synchronize(e.cx());
  choose_schedule(e);
  if (!e.skip_update) ++e.adam_step;
  IterationReport r;
  r.iteration = ++e.iteration;
  r.threads = e.host.threads;
  r.lr = e.skip_update ? 0 : adam::lr_at(e.o.lr_schedule, e.o.lr, e.adam_step);
  e.live_bytes = e.live_high_water = e.extent_high_water = {};  // this iteration's
  e.norm.global = std::numeric_limits<double>::quiet_NaN();
  Result<bool> ok = run_schedule(e, *e.tables, r.times);
  if (!ok) {
    if (!e.skip_update) --e.adam_step;
    --e.iteration;
    return make_error(ok.error());
  }
  e.k().synchronize(e.cx());
  e.batch_tokens = e.batch_targets = nullptr;
  double sum = 0;
  for (float x : e.step_losses) sum += x;  // in double on the host: the mean does not depend on a kernel's order
  double mean = sum / double(e.step_losses.size());
  if (e.pp > 1) {  // the last stage's (mp rank 0 of each of its dp ranks), to every rank
    Result<double> all = e.everyone()->all_reduce_sum(e.stage == e.pp - 1 && e.mp_rank == 0 ? mean : 0.0);
    if (!all) return make_error(all.error());
    mean = *all / e.dp;
  } else if (e.dp > 1) {  // the global batch's mean: every rank's mean, averaged
    Result<double> all = e.coll->all_reduce_sum(mean);
    if (!all) return make_error(all.error());
    mean = *all / e.dp;
  }
  r.loss = float(mean);
  r.grad_norm = e.norm.global;
  r.iteration_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.bytes_moved = e.bytes_moved;
  r.overlap = overlap_report(*e.sched, r.times);
  const std::array<std::size_t, kTiers> states = {e.tiers.device_state_bytes(), e.tiers.host_state_bytes(), 0};
  for (int t = 0; t < kTiers; ++t) {
    r.held_bytes[size_t(t)] = double(states[size_t(t)] + e.extent_high_water[size_t(t)]);
    r.live_bytes[size_t(t)] = double(states[size_t(t)] + e.live_high_water[size_t(t)]);
  }
  r.held_bytes[int(Tier::nvme)] = r.live_bytes[int(Tier::nvme)] = double(e.tiers.swap_bytes());
  if (!e.o.trace) r.times.clear();
  refit_host_threads(e);
  return r;
}

Result<std::vector<float>> Engine::master_params() {
  Result<std::vector<float>> part = ctx_->tiers.master_slices();
  if (!part) return make_error(part.error());
  return assemble(*ctx_, *part);
}

Result<std::vector<float>> Engine::gradients() {
  if (ctx_->grads_kept.empty()) return std::vector<float>{};
  return assemble(*ctx_, ctx_->grads_kept);
}

Result<std::vector<float>> Engine::logits() {
  EngineContext& e = *ctx_;
  const std::size_t count = std::size_t(e.o.config.bsz) * std::size_t(e.o.model.max_seq) * std::size_t(e.o.model.vocab);
  std::vector<float> out(count);
  e.k().copy_d2h_async(e.cx(), 0, out.data(), e.gpt->logits(0), count * sizeof(float));
  e.k().synchronize(e.cx());
  return out;
}

Result<bool> Engine::save(const std::string& dir, const RunPosition& at) { return save_checkpoint(*ctx_, dir, at); }
Result<RunPosition> Engine::resume(const std::string& dir) { return resume_checkpoint(*ctx_, dir); }

Result<std::vector<RankTraffic>> Engine::traffic_by_rank(const IterationReport& r) {
  EngineContext& e = *ctx_;
  std::vector<RankTraffic> out(std::size_t(e.world));
  for (int c = 0; c < kLinkClasses; ++c)
    for (int which = 0; which < 2; ++which) {
      const double v = which == 0 ? r.bytes_moved[size_t(c)] : e.sched->traffic_bytes[size_t(c)];
      std::vector<std::uint64_t> all = {std::uint64_t(std::llround(v))};
      if (e.world > 1) {
        Result<std::vector<std::uint64_t>> g = e.everyone()->all_gather_u64(all[0]);
        if (!g) return make_error(g.error());
        all = std::move(g).value();
      }
      for (std::size_t q = 0; q < all.size(); ++q)
        (which == 0 ? out[q].moved_bytes : out[q].schedule_bytes)[size_t(c)] = double(all[q]);
    }
  return out;
}

EngineStats Engine::stats() const {
  const EngineContext& e = *ctx_;
  EngineStats s;
  const size_t g = size_t(Tier::gpu), c = size_t(Tier::cpu);
  s.device_capacity_bytes = e.be->caps().capacity_bytes;
  s.device_state_bytes = e.tiers.device_state_bytes();
  s.device_reserved_bytes = e.be->caps().reserved_bytes;
  s.device_high_water_bytes = s.device_reserved_bytes + s.device_state_bytes + e.live_high_water[g];
  s.device_extent_bytes = s.device_reserved_bytes + s.device_state_bytes + e.extent_high_water[g];
  s.pinned_high_water_bytes = e.live_high_water[c];
  s.arena_bytes = e.tiers.arena_bytes();
  s.arena_extent_bytes = e.extent_high_water;
  s.arena_high_water_bytes = e.live_high_water;
  s.host_state_bytes = e.tiers.host_state_bytes();
  s.swap_file_bytes = e.tiers.swap_bytes();
  if (const io::IoEngine* io = const_cast<EngineContext&>(e).tiers.io()) s.io = io->counters();
  s.threads = e.host.threads;
  s.threads_fitted = e.host.fitted;
  s.load = e.host.load;
  return s;
}

std::vector<TraceEvent> Engine::trace_events(const IterationReport& r) const {
  std::vector<TraceEvent> out;
  for (const StepTime& t : r.times) {
    const Step& s = ctx_->sched->steps[size_t(t.step)];
    std::string track = step_resource(s);
    if (track.empty()) continue;
    if (track == "gpu_compute" || track == "pcie" || track == "nvlink") track = "gpu0 " + track;
    out.push_back({step_label(s), track, t.start_s, t.end_s, s.id, 0});
  }
  return out;
}

}  // namespace memwall::exec
