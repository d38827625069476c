#include "sim/reproduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>

#include "model/analysis.hpp"
#include "model/units.hpp"

namespace memwall::sim {
namespace {

struct Run {
  Placement placement;
  SimReport report;
  TrainingConfig config;  // as simulated (three_d: the micro-batch, stages and checkpoint interval chosen)
};

Placement with_ckpt(Placement p, Tier t) {
  p.act_ckpt.tier = t;
  p.name += t == Tier::cpu ? "+act_ckpt=cpu" : "";
  return p;
}

// The paper's placement for a Table 1 row: where fp16 parameters and optimizer states live.
Placement placement_for(const std::string& param_tier, const std::string& optim_tier) {
  if (optim_tier == "gpu") return *preset("zero3");
  if (param_tier == "gpu") {
    Placement p = *preset("zero_offload");
    if (optim_tier == "nvme") p.optim32 = p.grad16 = {Tier::nvme, true}, p.param16 = {Tier::gpu, true};
    p.fetch = ParamFetch::allgather;
    return p;
  }
  if (param_tier == "cpu" && optim_tier == "cpu") return *preset("zero_inf_cpu");
  Placement p = *preset("zero_inf_nvme");
  if (param_tier == "cpu") {
    p.param16.tier = Tier::cpu;
    p.name += "+param16=cpu";
  }
  return p;
}

// Activation checkpoints stay on the GPU when they fit there, else go to CPU memory (Sec. 5.1.2);
// when neither fits, memory-centric tiling (Sec. 5.1.3) splits the largest operators. With tensor
// slicing they are partitioned across the slices (DeepSpeed's partition_activations, which its
// Megatron-LM runs use: a slice keeps 1/mp of each).
Result<Run> run(const ModelSpec& m, Placement pl, TrainingConfig c, const HardwareProfile& p, const SimOptions& o) {
  c.seq = m.seq;
  std::vector<std::pair<int, Tier>> tries;  // the last one is replayed even when it overflows
  for (int tiling : {1, 2, 4, 8, 16})
    for (Tier t : {Tier::gpu, Tier::cpu}) tries.push_back({tiling, t});
  for (size_t i = 0; i < tries.size(); ++i) {
    const auto [tiling, t] = tries[i];
    Placement candidate = with_ckpt(pl, t);
    if (c.mp > 1) {
      candidate.act_ckpt.partitioned = true;
      candidate.name += t == Tier::cpu ? "/p" : "+act_ckpt=gpu/p";
    }
    c.tiling_factor = tiling;
    Result<Schedule> s = build_schedule(m, candidate, c, p);
    if (!s) return make_error(s.error());
    if (s->overflow && i + 1 < tries.size()) {
      // Persistent states (the model states each tier keeps) change neither with tiling nor with
      // where the checkpoints go: every later try overflows as this one does, so only the last is
      // built (fig5a and fig5b: 423 of 598 schedules built were such tries, 26 of 66 s).
      if (s->overflow->step < 0) i = tries.size() - 2;
      continue;
    }
    Result<SimReport> r = simulate_isolated(m, candidate, c, p, o);
    if (!r) return make_error(r.error());
    if (tiling > 1) candidate.name += "+tiling=" + std::to_string(tiling);
    return Run{candidate, *r, c};
  }
  return make_error("unreachable");
}

// Table 1's placements (fp16 parameters / optimizer states), least offloaded first: gpu/gpu (0.5T
// and 1T on 32 nodes), cpu/cpu (Table 2's ZeRO-Infinity on CPU memory), cpu/nvme (50B and 100B on
// one node: the parameters in CPU memory, the states on NVMe), nvme/nvme (0.5T and 1T on one node,
// 5T-20T on 32). Where the paper names no placement, or names one that does not fit, a row runs
// the first of these from `from` on that fits.
constexpr std::pair<const char*, const char*> kTable1Placements[] = {
    {"gpu", "gpu"}, {"cpu", "cpu"}, {"cpu", "nvme"}, {"nvme", "nvme"}};

Result<Run> run_first_fitting(const ModelSpec& m, size_t from, TrainingConfig c, const HardwareProfile& p,
                              const SimOptions& o) {
  std::string last;
  for (size_t i = from; i < std::size(kTable1Placements); ++i) {
    Result<Run> r = run(m, placement_for(kTable1Placements[i].first, kTable1Placements[i].second), c, p, o);
    if (!r) return r;
    if (!r->report.overflow) return r;
    last = r->report.overflow->message;
  }
  return make_error(m.name + " fits in none of the placements tried: " + last);
}

HardwareProfile nodes(const HardwareProfile& node, int gpus) {
  return *scale_to_nodes(node, std::max(1, (gpus + node.gpus_per_node - 1) / node.gpus_per_node));
}

// The two busiest resources of a replay and the optimizer's share of the step: "gpu_compute 94 %,
// network 13 %; optimizer 2 % of the step".
std::string limited_by(const SimReport& r) {
  if (r.overflow || !(r.iteration_s > 0)) return "";
  std::vector<std::pair<double, std::string>> busy;
  for (const auto& [what, f] : r.busy_fraction) busy.push_back({f, what});
  std::sort(busy.rbegin(), busy.rend());
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(2, busy.size()); ++i)
    out += (i ? ", " : "") + busy[i].second + " " + format_sig(100 * busy[i].first, 2) + " %";
  const auto bwd = r.phase_end_s.find("bwd"), opt = r.phase_end_s.find("optim");
  if (bwd != r.phase_end_s.end() && opt != r.phase_end_s.end()) {
    const double share = 100 * std::max(0.0, opt->second - bwd->second) / r.iteration_s;
    out += "; optimizer " + (share < 1 ? std::string("< 1") : format_sig(share, 2)) + " % of the step";
  }
  return out;
}

// The effects memwall models that move the paper's figures (issue 28), each turned off alone to
// measure it. Turning one off changes the simulation's inputs only: the profile (with()), the batch
// or the training configuration; the row's procedure (placement, checkpoints, tiling) runs again.
enum class Effect : std::uint8_t {
  batch_over_gpus, reserve, rate_by_shape, hbm, sync_grad_copies, on_demand, sync_fetches, measured_network,
  states_only, one_stream
};

const EffectInfo& info(Effect e) { return reproduction_effects()[size_t(e)]; }

// Which effect one simulation turns off (none: the row itself).
struct Off {
  std::optional<Effect> effect;
  bool operator()(Effect e) const { return effect == e; }
};

// The profile as simulated with `off`'s effect turned off.
HardwareProfile with(HardwareProfile p, Off off) {
  if (off(Effect::reserve)) p.gpu_reserve = GpuReserve{};
  if (off(Effect::rate_by_shape)) {  // gpu.peak for every operator
    p.peak_by_hidden.clear();
    p.gemm.clear();
    p.gpu_sms = 0;
  }
  if (off(Effect::hbm)) p.gpu_memory_Bps = 0;  // FLOPs alone, GPU Adam free
  if (off(Effect::measured_network)) p.inter_node_Bps = p.inter_node_nominal_Bps;  // the line rate
  return p;
}

// The effects of `wanted` that the profile has the part of (one without gives the row again) for a
// row on `gpus` GPUs (the network's only across nodes).
std::vector<Effect> present(const HardwareProfile& p, std::initializer_list<Effect> wanted, int gpus) {
  std::vector<Effect> out;
  for (Effect e : wanted) {
    if (e == Effect::measured_network && (p.inter_node_Bps == p.inter_node_nominal_Bps || gpus <= p.gpus_per_node))
      continue;
    if (e == Effect::reserve && !p.gpu_reserve.given) continue;
    if (e == Effect::rate_by_shape && p.peak_by_hidden.empty() && p.gemm.empty() && p.gpu_sms <= 0) continue;
    if (e == Effect::hbm && p.gpu_memory_Bps <= 0) continue;
    out.push_back(e);
  }
  return out;
}

// The simulation's options with `off`'s effect off: states_only off swaps the optimizer state's fp32
// gradient slot to NVMe and back as well (Eq. 10's 2 x 16 B per parameter); one_stream off runs a
// group's collectives at once where their dependencies allow.
SimOptions options(Off off) {
  SimOptions o;
  o.one_stream = !off(Effect::one_stream);
  if (off(Effect::states_only)) {
    MemorySizes z;
    z.optim_grad_bytes = 0;
    o.sizes = z;
  }
  return o;
}

// `effects`, and states_only where the optimizer states live on NVMe (elsewhere nothing swaps them).
std::vector<Effect> with_states(std::vector<Effect> effects, const Placement& pl) {
  if (pl.optim32.tier == Tier::nvme) effects.push_back(Effect::states_only);
  return effects;
}

// A row's value as simulated with one effect off.
using Value = std::function<Result<double>(Off)>;

// Simulates the row `x` again with each of `effects` turned off alone and records what it gives.
Result<bool> measure(const Progress& progress, ReproRow& x, const std::vector<Effect>& effects, const Value& value) {
  for (Effect e : effects) {
    if (progress) progress(x.figure + ": " + x.label + ", without " + info(e).label);
    Result<double> v = value(Off{e});
    if (!v) return make_error(x.label + " without " + info(e).label + ": " + v.error());
    x.effects.push_back({info(e).name, *v});
  }
  return true;
}

// The row's value from what `simulate` gives with one effect off: metric(what it gave).
template <typename Simulate, typename Metric>
Value value_of(Simulate simulate, Metric metric) {
  return [simulate, metric](Off off) -> Result<double> {
    auto r = simulate(off);
    if (!r) return make_error(r.error());
    return std::invoke(metric, *r);
  };
}

// The TFLOPS/GPU of a run, 0 when it does not fit.
double tflops(const Run& r) { return r.report.overflow ? 0.0 : r.report.tflops_per_gpu; }

// The effects every simulated row includes: the profile's parts.
constexpr std::initializer_list<Effect> kProfileEffects = {Effect::reserve, Effect::rate_by_shape, Effect::hbm,
                                                           Effect::measured_network};

ReproRow row(const std::string& fig, const std::string& label, const ModelSpec& m, const Run& r, double bsz,
             const std::string& metric, double value, double paper, const std::string& paper_text) {
  ReproRow x;
  x.figure = fig;
  x.label = label;
  x.model = m.name;
  x.strategy = r.placement.name;
  x.gpus = r.report.gpus;
  x.bsz = bsz;
  x.mp = r.report.mp;
  x.metric = metric;
  x.value = value;
  x.paper = paper;
  x.paper_text = paper_text;
  x.disagrees = paper > 0 && std::fabs(value - paper) > 0.15 * paper;
  x.limited_by = limited_by(r.report);
  return x;
}

using Rows = std::vector<ReproRow>;

// Adds the run `r` of the last row again as ZeRO-3 ran in the DeepSpeed releases of the paper's
// time: parameters fetched on demand (prefetch depth 0: v0.3.15 to v0.5.10 never prefetched, their
// module trace never matched, microsoft/DeepSpeed issue #1069, fixed by PR #1453 in v0.6.0), each
// after a synchronize of the device (sync_fetches: torch.cuda.synchronize() before each parameter's
// all-gather, partition_parameters.py, v0.3.15 to v0.5.x). The same placement, batch and
// checkpoints: fewer parameters in flight never need more memory. Returns the new row's value.
Result<double> add_fetched_on_demand(const Progress& progress, Rows& rows, const ModelSpec& m, const Run& r,
                                     const HardwareProfile& p) {
  const ReproRow x = rows.back();
  auto config = [&](Off off) {
    TrainingConfig c = r.config;
    if (!off(Effect::on_demand)) c.prefetch_depth = 0;
    c.sync_fetches = !off(Effect::sync_fetches);
    return c;
  };
  auto then = [&](Off off) { return simulate_isolated(m, r.placement, config(off), with(p, off), options(off)); };
  Result<SimReport> rep = then(Off{});
  if (!rep) return make_error(rep.error());
  if (rep->overflow) return make_error(x.label + " fetched on demand: " + rep->overflow->message);
  Run d{r.placement, *rep, config(Off{})};
  d.placement.name += "+prefetch_depth=0+sync_fetches";
  ReproRow y = row(x.figure, x.label + ", fetched on demand", m, d, x.bsz, x.metric, rep->tflops_per_gpu, x.paper,
                   x.paper_text);
  y.note = format_sig(y.value / x.value, 2) + "x the row above";
  auto tflops_of = [](const SimReport& s) { return s.overflow ? 0.0 : s.tflops_per_gpu; };
  if (Result<bool> e = measure(progress, y,
                               with_states(present(p, {Effect::on_demand, Effect::sync_fetches, Effect::measured_network},
                                                   int(p.total_gpus())),
                                           r.placement),
                               value_of(then, tflops_of));
      !e)
    return make_error(e.error());
  rows.push_back(y);
  return y.value;
}

// Fig. 5a's 3D parallelism baseline (Sec. 8.1: Megatron-LM's tensor slicing with pipeline stages):
// three_d keeps the model states whole on every GPU of a slice and stage (no ZeRO), so 0.5T takes
// the memory of all 512 GPUs: dp 1, mp 8 or 16 inside a node, pp for the rest. It trains the global
// batch of the ZeRO-Infinity row beside it, 1F1B over micro-batches of the fewest samples that keep
// them at most kThreeDMicroBatches (smaller micro-batches: a smaller bubble and fewer checkpoint
// bytes in flight), at the smallest checkpoint interval that fits, checkpoints partitioned across
// the slices (DeepSpeed's partition_activations, which its 3D runs use); the faster mp is the row.
// Returns the runs' last overflow when none fits.
// Every stage's schedule is held at once: 0.5T's 124 layers x 256 micro-batches estimate 2.9 GB,
// within the eighth of 24 GB a schedule may take (schedule_size_check; the replay of 224 took 0.9 GB).
// A machine with less memory refuses the row with the --grad-accum message.
constexpr int kThreeDMicroBatches = 256;

Result<Run> three_d(const ModelSpec& m, int gpus, long global_batch, const HardwareProfile& p) {
  std::optional<Run> best;
  Run last;
  for (int mp : {8, 16}) {
    TrainingConfig c;
    c.seq = m.seq;
    c.mp = mp;
    c.dp = 1;
    c.pp = gpus / mp;
    long bsz = (global_batch + kThreeDMicroBatches - 1) / kThreeDMicroBatches;
    while (global_batch % bsz != 0) ++bsz;
    c.bsz = double(bsz);
    c.grad_accum = int(global_batch / bsz);
    const int blocks = (m.layers + c.pp - 1) / c.pp;  // per stage, at most
    for (int ci = 1; ci <= blocks; ci *= 2) {
      c.ci = ci;
      Placement pl = *preset("three_d");
      pl.act_ckpt.partitioned = true;  // DeepSpeed's partition_activations, as its 3D runs (seed 004)
      Result<SimReport> r = simulate_isolated(m, pl, c, p, SimOptions{});
      if (!r) return make_error(r.error());
      pl.name += "+act_ckpt=gpu/p+pp=" + std::to_string(c.pp) + "+ci=" + std::to_string(ci) + "+micro_batches=" + std::to_string(c.grad_accum);
      last = Run{pl, *r, c};
      if (r->overflow) continue;
      if (!best || r->tflops_per_gpu > best->report.tflops_per_gpu) best = last;
      break;
    }
  }
  return best ? *best : last;
}

Result<Rows> fig5a(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  const std::pair<const char*, double> paper[] = {{"table1-0.5T", 0}, {"table1-1T", 0}, {"table1-5T", 0},
                                                  {"table1-10T", 43}, {"table1-20T", 34}};
  for (auto [name, tflops_paper] : paper) {
    CatalogueEntry e = *find_catalogue_entry(name);
    const PaperSetup& s = e.setups.back();  // the 512-GPU row
    if (progress) progress(std::string("fig5a: ") + name + " on 512 GPUs");
    std::string note;
    auto zero_inf = [&](Off off) -> Result<Run> {
      // Table 1's batch/GPU is the global batch over the GPUs (20T's 1.25 is no whole number of
      // samples per rank): a data-parallel rank, the mp GPUs of one slice group, trains batch/GPU x mp
      // samples. Off: batch/GPU samples per data-parallel rank.
      TrainingConfig c;
      c.bsz = off(Effect::batch_over_gpus) ? s.bsz : s.bsz * s.mp;
      c.mp = s.mp;
      const HardwareProfile p = with(nodes(node, s.gpus), off);
      Result<Run> r = run(e.spec, placement_for(s.param_tier, s.optim_tier), c, p, options(off));
      if (!r || !r->report.overflow) return r;
      // Table 1 keeps 0.5T/1T entirely on 512 GPUs; at Eq. 2's 20 B/param that is more than a V100
      // holds, so take the next placement of Table 1's that does fit, and say so.
      if (!off.effect)
        note = "Table 1's " + s.param_tier + "/" + s.optim_tier + " placement does not fit: " + r->report.overflow->message;
      return run_first_fitting(e.spec, 1, c, p, options(off));
    };
    Result<Run> r = zero_inf(Off{});
    if (!r) return make_error(r.error());
    rows.push_back(row("fig5a", std::string(name).substr(7) + " on 512 GPUs", e.spec, *r, s.bsz, "tflops_per_gpu",
                       r->report.tflops_per_gpu, tflops_paper,
                       tflops_paper > 0 ? format_g(tflops_paper) + " TFLOPS/GPU" : "not stated (about 49 at the best size)"));
    rows.back().note = note;
    if (Result<bool> m = measure(progress, rows.back(),
                                 with_states(present(node, {Effect::batch_over_gpus, Effect::reserve, Effect::rate_by_shape,
                                                            Effect::hbm, Effect::measured_network, Effect::one_stream},
                                                    s.gpus),
                                             r->placement),
                                 value_of(zero_inf, tflops));
        !m)
      return make_error(m.error());
    const ReproRow inf = rows.back();
    Result<double> lazy = add_fetched_on_demand(progress, rows, e.spec, *r, nodes(node, s.gpus));
    if (!lazy) return make_error(lazy.error());
    // Sec. 8.1: "For the 500B model (close to the largest that 3D parallelism can run on these
    // resources), ZeRO-Infinity and 3D parallelism achieve nearly identical throughput. When
    // increasing the model size further, 3D parallelism simply runs out of memory."
    if (std::string(name) != "table1-0.5T" && std::string(name) != "table1-1T") continue;
    if (progress) progress(std::string("fig5a: ") + name + " with 3D parallelism on 512 GPUs");
    const long global = std::lround(s.bsz * s.gpus);
    auto three = [&](Off off) { return three_d(e.spec, s.gpus, global, with(nodes(node, s.gpus), off)); };
    Result<Run> d = three(Off{});
    if (!d) return make_error(d.error());
    const bool fits = !d->report.overflow;
    // the paper's "nearly identical" at 0.5T: ZeRO-Infinity's row as the number to agree with
    const bool half = std::string(name) == "table1-0.5T";
    ReproRow x = row("fig5a", std::string(name).substr(7) + " on 512 GPUs, 3D parallelism", e.spec, *d,
                     d->config.bsz, "tflops_per_gpu", fits ? d->report.tflops_per_gpu : 0, half ? inf.value : 0,
                     half ? "nearly identical to ZeRO-Infinity (no number; its row here)" : "runs out of memory");
    x.note = fits ? format_sig(x.value / inf.value, 2) + "x ZeRO-Infinity's row (" +
                        format_sig(x.value / *lazy, 2) + "x fetched on demand), global batch " +
                        std::to_string(global)
                  : "does not fit at mp 8 or 16 and any checkpoint interval: " + d->report.overflow->message;
    if (Result<bool> m = measure(progress, x, present(node, kProfileEffects, s.gpus), value_of(three, tflops)); !m) return make_error(m.error());
    rows.push_back(x);
  }
  return rows;
}

Result<Rows> fig5b(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  CatalogueEntry e = *find_catalogue_entry("table1-1T");
  for (int gpus : {64, 128, 256, 512}) {
    if (progress) progress("fig5b: 1T on " + std::to_string(gpus) + " GPUs");
    auto zero_inf = [&](Off off) {
      TrainingConfig c;
      // Table 1's 5 per GPU: 20 per slice group of mp 4 (the global batch over the GPUs); off: 5 per group
      c.bsz = off(Effect::batch_over_gpus) ? 5 : 5 * 4;
      c.mp = 4;
      return run_first_fitting(e.spec, 0, c, with(nodes(node, gpus), off), options(off));  // Fig. 5b names none
    };
    Result<Run> r = zero_inf(Off{});
    if (!r) return make_error(r.error());
    rows.push_back(row("fig5b", "1T on " + std::to_string(gpus) + " GPUs", e.spec, *r, 5, "tflops_per_gpu",
                       r->report.tflops_per_gpu, gpus == 64 ? 44 : 0,
                       gpus == 64 ? "44 TFLOPS/GPU; superlinear scaling to 512" : "superlinear scaling"));
    if (Result<bool> m = measure(progress, rows.back(),
                                 with_states(present(node, {Effect::batch_over_gpus, Effect::reserve, Effect::rate_by_shape,
                                                            Effect::hbm, Effect::measured_network, Effect::one_stream},
                                                    gpus),
                                             r->placement),
                                 value_of(zero_inf, tflops));
        !m)
      return make_error(m.error());
    if (Result<double> lazy = add_fetched_on_demand(progress, rows, e.spec, *r, nodes(node, gpus)); !lazy)
      return make_error(lazy.error());
  }
  return rows;
}

Result<Rows> fig5c(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  for (const char* name : {"table1-10B", "table1-50B", "table1-100B", "table1-0.5T", "table1-1T"}) {
    CatalogueEntry e = *find_catalogue_entry(name);
    const PaperSetup& s = e.setups.front();  // the one-node row
    if (progress) progress(std::string("fig5c: ") + name + " on one DGX-2");
    auto one_node = [&](Off off) {
      TrainingConfig c;
      c.bsz = s.bsz;
      return run(e.spec, placement_for(s.param_tier, s.optim_tier), c, with(node, off), options(off));
    };
    Result<Run> r = one_node(Off{});
    if (!r) return make_error(r.error());
    if (r->report.overflow) return make_error(std::string(name) + ": " + r->report.overflow->message);
    bool up_to_100b = params_eq1(e.spec.layers, e.spec.hidden) <= 1.1e11;
    rows.push_back(row("fig5c", std::string(name).substr(7) + " on 16 GPUs", e.spec, *r, s.bsz, "tflops_per_gpu",
                       r->report.tflops_per_gpu, up_to_100b ? 40 : 0,
                       up_to_100b ? "over 40 TFLOPS/GPU up to 100B" : "not stated"));
    auto over_40 = [&] {  // "over 40" agrees however far over
      if (up_to_100b && rows.back().value >= 40) rows.back().disagrees = false;
    };
    over_40();
    if (Result<bool> m = measure(progress, rows.back(),
                                 with_states(present(node, kProfileEffects, node.gpus_per_node), r->placement),
                                 value_of(one_node, tflops));
        !m)
      return make_error(m.error());
    if (Result<double> lazy = add_fetched_on_demand(progress, rows, e.spec, *r, node); !lazy) return make_error(lazy.error());
    over_40();
  }
  return rows;
}

Result<Rows> fig8(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  CatalogueEntry e = *find_catalogue_entry("table6-8B");
  for (const PaperSetup& s : e.setups) {
    if (progress) progress("fig8: 8B backward on " + std::to_string(s.gpus) + " GPUs");
    struct Both {
      Run inf, off;
      double speedup() const { return off.report.backward_s() / inf.report.backward_s(); }
    };
    auto both = [&](Off off) -> Result<Both> {
      TrainingConfig c;
      c.bsz = s.bsz;
      c.dp = s.gpus;
      const HardwareProfile p = with(nodes(node, s.gpus), off);
      // Gradients offloaded to CPU memory; parameters stay on the GPU (Sec. 8.6: gradient offload).
      Placement inf = *preset("zero_offload");
      inf.fetch = ParamFetch::allgather;  // ZeRO-Infinity: every rank offloads its partition over its own PCIe link
      inf.name = "zero_inf (gradients to cpu)";
      Placement owner = *preset("zero_offload");  // the owner moves each gradient over one PCIe link
      Result<Run> a = run(e.spec, inf, c, p, SimOptions{});
      // ZeRO-Offload as DeepSpeed's stage 2 ran it then: one owner at a time
      c.sync_grad_copies = !off(Effect::sync_grad_copies);
      Result<Run> b = run(e.spec, owner, c, p, SimOptions{});
      if (!a) return make_error(a.error());
      if (!b) return make_error(b.error());
      return Both{*a, *b};
    };
    Result<Both> r = both(Off{});
    if (!r) return make_error(r.error());
    ReproRow x = row("fig8", "8B on " + std::to_string(s.gpus) + " GPUs", e.spec, r->inf, s.bsz, "backward_speedup",
                     r->speedup(), s.gpus == 64 ? 2.0 : 0, s.gpus == 64 ? "nearly 2x at 64 GPUs" : "grows with GPUs");
    x.strategy = "zero_inf vs zero_offload";
    x.note = "backward " + format_sig(r->inf.report.backward_s(), 3) + " s vs " +
             format_sig(r->off.report.backward_s(), 3) + " s";
    if (Result<bool> m = measure(progress, x, present(node, {Effect::sync_grad_copies, Effect::reserve, Effect::rate_by_shape, Effect::hbm, Effect::measured_network}, s.gpus),
                                 value_of(both, &Both::speedup));
        !m)
      return make_error(m.error());
    rows.push_back(x);
  }
  return rows;
}

Result<Rows> fig9(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  CatalogueEntry e = *find_catalogue_entry("table7-8B");
  for (const PaperSetup& s : e.setups) {
    if (progress) progress("fig9: 8B, bsz " + format_g(s.bsz) + ", overlap on and off");
    struct Both {
      Run on, off;
      double speedup() const { return off.report.iteration_s / on.report.iteration_s; }
    };
    auto both = [&](Off o) -> Result<Both> {
      TrainingConfig c;
      c.bsz = s.bsz;
      c.dp = s.gpus;
      SimOptions serial;
      serial.overlap = false;
      const HardwareProfile p = with(nodes(node, s.gpus), o);
      Result<Run> a = run(e.spec, *preset("zero_inf_cpu"), c, p, SimOptions{});
      Result<Run> b = run(e.spec, *preset("zero_inf_cpu"), c, p, serial);
      if (!a) return make_error(a.error());
      if (!b) return make_error(b.error());
      return Both{*a, *b};
    };
    Result<Both> r = both(Off{});
    if (!r) return make_error(r.error());
    ReproRow x = row("fig9", "8B, bsz " + format_g(s.bsz) + ", 64 GPUs", e.spec, r->on, s.bsz, "overlap_speedup",
                     r->speedup(), 0, "large at small bsz, diminishing at large");
    x.note = format_sig(r->on.report.tflops_per_gpu, 3) + " vs " + format_sig(r->off.report.tflops_per_gpu, 3) +
             " TFLOPS/GPU";
    if (Result<bool> m = measure(progress, x, present(node, kProfileEffects, s.gpus), value_of(both, &Both::speedup)); !m) return make_error(m.error());
    rows.push_back(x);
  }
  return rows;
}

Result<Rows> fig10(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  for (const char* name : {"table8-h2K", "table8-h8K", "table8-h16K", "table8-h32K", "table8-h64K"}) {
    CatalogueEntry e = *find_catalogue_entry(name);
    const PaperSetup& s = e.setups.front();
    if (progress) progress(std::string("fig10: ") + name + ", checkpoints on GPU and CPU");
    const Placement base = s.optim_tier == "nvme" ? *preset("zero_inf_nvme") : *preset("zero_inf_cpu");
    struct Both {
      Run gpu;
      SimReport cpu;
      double slowdown() const { return cpu.iteration_s / gpu.report.iteration_s; }
    };
    auto both = [&](Off off) -> Result<Both> {
      TrainingConfig c;
      c.bsz = s.bsz;
      c.dp = s.gpus;
      c.seq = e.spec.seq;
      const HardwareProfile p = with(nodes(node, s.gpus), off);
      Result<Run> gpu = run(e.spec, base, c, p, SimOptions{});  // on GPU when it fits
      if (!gpu) return make_error(gpu.error());
      Placement cpu = with_ckpt(base, Tier::cpu);
      for (int t = 1; t <= 16; t *= 2) {  // the same tiling as the GPU run needed, or more
        c.tiling_factor = t;
        Result<Schedule> sch = build_schedule(e.spec, with_ckpt(base, gpu->placement.act_ckpt.tier), c, p);
        if (sch && !sch->overflow) break;
      }
      Result<SimReport> moved = simulate_isolated(e.spec, cpu, c, p, SimOptions{});
      if (!moved) return make_error(moved.error());
      if (gpu->report.overflow || moved->overflow) return make_error(std::string(name) + ": does not fit on 64 GPUs");
      return Both{*gpu, *moved};
    };
    Result<Both> r = both(Off{});
    if (!r) return make_error(r.error());
    bool small = e.spec.hidden <= 16384;
    ReproRow x = row("fig10", std::string(name).substr(7) + ", 5 layers", e.spec, r->gpu, s.bsz,
                     "ckpt_offload_slowdown", r->slowdown(), small ? 0 : 1.0,
                     small ? "up to 1.2x at small hidden sizes" : "minimal at 32K and 64K");
    x.strategy = base.name + ": act_ckpt gpu vs cpu";
    if (Result<bool> m = measure(progress, x, present(node, kProfileEffects, s.gpus), value_of(both, &Both::slowdown)); !m) return make_error(m.error());
    rows.push_back(x);
  }
  return rows;
}

// Seed 004's what-ifs on Table 1's 10B model (its one-node placement: everything on the GPUs).
// 1-bit Adam: one iteration of the compression stage against plain Adam as the data-parallel
// group spans more nodes, at bsz 1; the end-to-end figure averages in the blog's 15 % warm-up.
// Sparse attention: the longest sequence (bsz 1, a multiple of 1024) whose schedule fits one
// DGX-2 dense and at density 0.1, then both densities simulated at the dense limit.
Result<Rows> seed004(const HardwareProfile& node, const Progress& progress) {
  Rows rows;
  CatalogueEntry e = *find_catalogue_entry("table1-10B");
  const PaperSetup& s = e.setups.front();
  const Placement pl = placement_for(s.param_tier, s.optim_tier);
  for (int gpus : {16, 64, 256}) {
    if (progress) progress("seed004: 10B with and without 1-bit Adam on " + std::to_string(gpus) + " GPUs");
    TrainingConfig c;
    c.bsz = 1;  // Table 1's 8 hides the gradient reduce-scatters behind compute; 1 exposes the network
    c.seq = e.spec.seq;
    TrainingConfig onebit = c;
    onebit.what_if.onebit_adam = true;
    struct Both {
      SimReport plain, onebit;
      double speedup() const { return plain.iteration_s / onebit.iteration_s; }
    };
    auto both = [&](Off off) -> Result<Both> {
      const HardwareProfile p = with(nodes(node, gpus), off);
      Result<SimReport> a = simulate_isolated(e.spec, pl, c, p, SimOptions{});
      Result<SimReport> b = simulate_isolated(e.spec, pl, onebit, p, SimOptions{});
      if (!a) return make_error(a.error());
      if (!b) return make_error(b.error());
      return Both{*a, *b};
    };
    Result<Both> r = both(Off{});
    if (!r) return make_error(r.error());
    const SimReport& a = r->plain;
    const SimReport& b = r->onebit;
    const Run run{pl, b, onebit};
    const double end_to_end = a.iteration_s / onebit_end_to_end(a.iteration_s, b.iteration_s, onebit.what_if.onebit_warmup);
    ReproRow x = row("seed004", "10B on " + std::to_string(gpus) + " GPUs, 1-bit Adam", e.spec, run, c.bsz,
                     "onebit_speedup", r->speedup(), 0,
                     "up to 3.5x end-to-end on 40 Gbps Ethernet (BERT-Large, blog); 16x less traffic once compressed");
    x.note = format_sig(a.iteration_s, 4) + " s vs " + format_sig(b.iteration_s, 4) + " s per iteration; " +
             format_sig(a.tflops_per_gpu, 3) + " vs " + format_sig(b.tflops_per_gpu, 3) +
             " TFLOPS/GPU; end-to-end with 15 % warm-up " + format_sig(end_to_end, 3) + "x";
    if (Result<bool> m = measure(progress, x, present(node, kProfileEffects, gpus), value_of(both, &Both::speedup)); !m) return make_error(m.error());
    rows.push_back(x);
  }

  // The longest sequence that fits, dense and sparse, and both densities simulated at the dense limit.
  struct Sparse {
    long dense = 0, sparse = 0;
    SimReport a, b;  // dense and density 0.1, at the dense limit
    TrainingConfig c, sa;
    double dense_seq() const { return double(dense); }
    double sparse_seq() const { return double(sparse); }
    double speedup() const { return a.iteration_s / b.iteration_s; }
  };
  auto sparse = [&](Off off) -> Result<Sparse> {
    const HardwareProfile p = with(node, off);
    auto fits = [&](long seq, double density) {
      ModelSpec m = e.spec;
      m.seq = seq;
      TrainingConfig c;
      c.bsz = 1;
      c.seq = seq;
      c.what_if.attention_density = density;
      Result<Schedule> sch = build_schedule(m, pl, c, p);
      return sch && !sch->overflow;
    };
    // doubling, then bisection on multiples of 1024
    auto longest = [&](double density) {
      long lo = 0, hi = 1024;  // lo fits (0: nothing yet), hi does not
      while (hi <= kMaxSeq / 2 && fits(hi, density)) lo = hi, hi *= 2;
      while (hi - lo > 1024) {
        const long mid = (lo + hi) / 2 / 1024 * 1024;
        (fits(mid, density) ? lo : hi) = mid;
      }
      return lo;
    };
    Sparse x;
    x.dense = longest(1);
    x.sparse = longest(0.1);
    if (x.dense == 0) return make_error("seed004: table1-10B does not fit one DGX-2 at sequence 1024");
    ModelSpec m = e.spec;
    m.seq = x.dense;
    x.c.bsz = 1;
    x.c.seq = x.dense;
    x.sa = x.c;
    x.sa.what_if.attention_density = 0.1;
    Result<SimReport> a = simulate_isolated(m, pl, x.c, p, SimOptions{});
    Result<SimReport> b = simulate_isolated(m, pl, x.sa, p, SimOptions{});
    if (!a) return make_error(a.error());
    if (!b) return make_error(b.error());
    x.a = *a;
    x.b = *b;
    return x;
  };
  if (progress) progress("seed004: 10B, longest sequence on one DGX-2, dense and at density 0.1");
  Result<Sparse> r = sparse(Off{});
  if (!r) return make_error(r.error());
  ReproRow d = row("seed004", "10B on 16 GPUs, longest sequence, dense", e.spec, Run{pl, r->a, r->c}, 1, "max_seq",
                   r->dense_seq(), 0, "the dense limit");
  ReproRow x = row("seed004", "10B on 16 GPUs, longest sequence, density 0.1", e.spec, Run{pl, r->b, r->sa}, 1,
                   "max_seq", r->sparse_seq(), 0, "10x (BERT-Base) and 16x (BERT-Large) longer than dense (blog)");
  x.note = format_sig(r->sparse_seq() / r->dense_seq(), 3) + "x the dense limit";
  ReproRow t = row("seed004", "10B on 16 GPUs, sequence " + std::to_string(r->dense) + ", density 0.1", e.spec,
                   Run{pl, r->b, r->sa}, 1, "sparse_attention_speedup", r->speedup(), 0,
                   "up to 6.3x (BERT-Base) and 5.3x (BERT-Large) faster (blog)");
  t.note = format_sig(r->a.iteration_s, 4) + " s vs " + format_sig(r->b.iteration_s, 4) + " s per iteration";
  // The three rows come from one computation: each effect turned off runs it once.
  for (Effect off : present(node, kProfileEffects, node.gpus_per_node)) {
    if (progress) progress("seed004: 10B, longest sequence, without " + std::string(info(off).label));
    Result<Sparse> o = sparse(Off{off});
    if (!o) return make_error(o.error());
    d.effects.push_back({info(off).name, o->dense_seq()});
    x.effects.push_back({info(off).name, o->sparse_seq()});
    t.effects.push_back({info(off).name, o->speedup()});
  }
  rows.insert(rows.end(), {d, x, t});
  return rows;
}

}  // namespace

const std::vector<EffectInfo>& reproduction_effects() {
  // in Effect's order
  static const std::vector<EffectInfo> effects = {
      {"batch_over_gpus", "Table 1's batch read as global / GPUs",
       "Table 1's batch/GPU is the global batch over the GPUs, so a data-parallel rank of mp GPUs trains "
       "batch/GPU x mp samples (issue 28: 20T's 1.25 is no whole number of samples per rank); off: batch/GPU "
       "samples per data-parallel rank"},
      {"reserve", "framework reserve",
       "gpu.reserve: the CUDA context, cuBLAS workspace and NCCL buffers each GPU keeps beside the training "
       "(the profile's sources); off: the whole GPU memory for the training"},
      {"rate_by_shape", "compute rate by shape",
       "each linear layer at its GEMM's rate: gpu.peak_by_hidden (the DGX-2's: Sec. 4.2's achievable 62-78 "
       "TFLOPS/GPU for hidden sizes 8K-64K), gpu.gemm (measured by calibrate) or gpu.sms (the datasheet tile and "
       "wave model); off: gpu.peak for every operator (the DGX-2's: the 70 TFLOPS average)"},
      {"hbm", "HBM-bound operators",
       "gpu.memory_bandwidth: LayerNorm, GeLU, residual adds, the embedding and Adam on the GPU no faster than "
       "their bytes through HBM (V100: 900 GB/s, datasheet); off: FLOPs alone, Adam on the GPU free"},
      {"sync_grad_copies", "owners' gradient copies one at a time",
       "ZeRO-Offload's owners copy gradients to CPU memory one rank at a time, as DeepSpeed's stage 2 of the "
       "paper's time did (stage2.py, v0.3.x; fixed by PR #1067 in v0.4.0); off: every owner's copy overlaps"},
      {"on_demand", "fetched on demand",
       "parameters fetched on demand, as DeepSpeed v0.3.15-v0.5.10 ran ZeRO-3 (its prefetch never matched "
       "the module trace: microsoft/DeepSpeed issue #1069, fixed by PR #1453 in v0.6.0); off: prefetched "
       "(Sec. 6.2), at the default depth"},
      {"sync_fetches", "device synchronized before each fetch",
       "torch.cuda.synchronize() before each parameter's all-gather and every all-gather in flight waited for "
       "before a module computes, as DeepSpeed v0.3.15-v0.5.x ran ZeRO-3 (partition_parameters.py, stage3.py); "
       "so a fetch to the GPU waits for all of its rank's earlier device work, gradient reduce-scatters and "
       "copies included; off: a fetch waits only for what it needs"},
      {"measured_network", "InfiniBand at its measured bandwidth",
       "links.inter_node_measured: the nodes' InfiniBand as collectives measured it (the DGX-2's: 660 of 800 Gbps "
       "on 8 DGX-2 nodes, microsoft/Megatron-DeepSpeed examples_deepspeed/rebase/README.md; an EDR NIC's NCCL "
       "rings reach about 12 of 12.5 GB/s, NVIDIA/nccl-tests issue #29); off: links.inter_node, the line rate "
       "(Sec. 8.1's 800 Gbps)"},
      {"states_only", "optimizer states swapped without their gradient",
       "of Eq. 2's 16 B of fp32 optimizer state per parameter, NVMe reads and writes back the 12 B of parameter, "
       "momentum and variance; the fp32 gradient is made from the 16-bit one at every step (DeepSpeed's "
       "PartitionedOptimizerSwapper.swap_out_optimizer_state writes the fp32 parameter, exp_avg and exp_avg_sq "
       "only; memwall's executor swaps 12 B too); off: all 16 B read and written, as Eq. 10's 2 x 16 B per "
       "parameter counts them"},
      {"one_stream", "a group's collectives one at a time",
       "each communicator's collectives run one at a time in the order its rank issues them: one NCCL stream "
       "per communicator, as PyTorch's ProcessGroupNCCL gives DeepSpeed's all-gathers and reduce-scatters "
       "(torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, one stream per device and process group) and as "
       "memwall's executor runs them; off: every collective its dependencies allow runs at once, the "
       "concurrent ones sharing the links"},
  };
  return effects;
}

std::vector<std::string> reproduction_figures() {
  return {"fig5a", "fig5b", "fig5c", "fig8", "fig9", "fig10", "seed004"};
}

Result<std::vector<ReproRow>> reproduce(const std::string& figure, const HardwareProfile& node,
                                        const Progress& progress) {
  if (figure == "fig5a") return fig5a(node, progress);
  if (figure == "fig5b") return fig5b(node, progress);
  if (figure == "fig5c") return fig5c(node, progress);
  if (figure == "fig8") return fig8(node, progress);
  if (figure == "fig9") return fig9(node, progress);
  if (figure == "fig10") return fig10(node, progress);
  if (figure == "seed004") return seed004(node, progress);
  return make_error("--figure: unknown figure \"" + figure +
                    "\" (expected fig5a, fig5b, fig5c, fig8, fig9, fig10, seed004 or all)");
}

std::string repro_csv(const std::vector<ReproRow>& rows) {
  std::ostringstream o;
  o << "figure,label,model,strategy,gpus,bsz,mp,metric,value,paper,disagrees,note,limited_by,effects\n";
  for (const auto& r : rows) {
    std::string effects;  // "batch_over_gpus=25.7;reserve=55.3": the row's value with each turned off
    for (const EffectMeasure& e : r.effects) effects += (effects.empty() ? "" : ";") + e.name + "=" + format_g(e.without);
    o << r.figure << "," << csv_field(r.label) << "," << r.model << "," << csv_field(r.strategy) << "," << r.gpus << ","
      << r.bsz << "," << r.mp << "," << r.metric << "," << r.value << "," << (r.paper > 0 ? format_g(r.paper) : "")
      << "," << (r.disagrees ? "yes" : "no") << "," << csv_field(r.note) << "," << csv_field(r.limited_by) << "," << effects << "\n";
  }
  return o.str();
}

// What moves a row: each effect turned off alone, "Table 1's batch read as global / GPUs 2.15x (25.7
// without)", then those that do not move it by 0.5 % (the drift check's tolerance).
std::string effects_cell(const ReproRow& r) {
  std::string moved, still;
  for (const EffectMeasure& e : r.effects) {
    const auto info = std::find_if(reproduction_effects().begin(), reproduction_effects().end(),
                                   [&](const EffectInfo& i) { return e.name == i.name; });
    const std::string label = info == reproduction_effects().end() ? e.name : info->label;
    std::string& to = (e.without > 0 ? std::fabs(r.value / e.without - 1) >= 0.005 : r.value > 0) ? moved : still;
    to += (to.empty() ? "" : &to == &moved ? "; " : ", ") + label;
    if (&to == &moved)
      to += e.without > 0 ? " " + format_sig(r.value / e.without, 3) + "x (" + format_sig(e.without, 3) + " without)"
                          : " (does not fit without)";
  }
  if (!still.empty()) moved += (moved.empty() ? "" : "; ") + std::string("not moved by ") + still;
  return moved;
}

std::string repro_markdown(const std::string& figure, const std::vector<ReproRow>& rows) {
  std::ostringstream o;
  o << "# " << figure << ": simulated beside the paper\n\n";
  const bool one_metric =
      std::all_of(rows.begin(), rows.end(), [&](const ReproRow& r) { return r.metric == rows[0].metric; });
  o << "| configuration | strategy | GPUs | bsz | mp | " << (rows.empty() || !one_metric ? "value" : rows[0].metric)
    << " (memwall) | paper | agrees within 15 % | limited by (simulated) | effects (each turned off alone) |\n"
    << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows)
    o << "| " << r.label << " | " << r.strategy << " | " << r.gpus << " | " << format_g(r.bsz) << " | " << r.mp
      << " | " << (one_metric ? "" : r.metric + " ") << (r.metric == "max_seq" ? format_g(r.value) : format_sig(r.value, 3)) << (r.note.empty() ? "" : " (" + r.note + ")") << " | " << r.paper_text
      << " | " << (r.paper > 0 ? (r.disagrees ? "**no**" : "yes") : "n/a") << " | " << r.limited_by << " | "
      << effects_cell(r) << " |\n";
  // the effects the rows measured, what each is and what turning it off simulates
  std::string legend;
  for (const EffectInfo& i : reproduction_effects())
    if (std::any_of(rows.begin(), rows.end(), [&](const ReproRow& r) {
          return std::any_of(r.effects.begin(), r.effects.end(), [&](const EffectMeasure& e) { return e.name == i.name; });
        }))
      legend += std::string("- **") + i.label + "** (`" + i.name + "`): " + i.source + ".\n";
  if (!legend.empty())
    o << "\nEach row is simulated again with each effect it includes turned off alone; the last column gives the "
         "row's value over that (x) and the value itself, and names the effects that move it less than 0.5 %.\n\n"
      << legend;
  return o.str();
}

}  // namespace memwall::sim
